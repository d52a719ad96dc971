#!/usr/bin/env bash
# `megatron serve`'s flag mistakes: one line on stderr naming the flag, a non-zero exit, before
# anything listens; the checkpoint it was pointed at is left intact. (Bad requests to a running
# server are in serve.sh.)
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
"$MEGATRON" pretrain --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1 \
  --train-iters 1 --lr 1e-3 --mock-data --vocab-size 50 --eval-iters 0 --no-progress-bar --device cpu \
  --data-cache-path "$TMP/cache" --save "$TMP/ck" >"$TMP/train.log" 2>&1 \
  || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")

expect_error "--load DIR is required" serve --port 0
expect_error "--load: directory '$TMP/none' does not exist" serve --load "$TMP/none" --port 0
expect_error "--iteration 7: --load $TMP/ck has no such saved iteration" serve --load "$TMP/ck" --iteration 7 --port 0
expect_error "--port: value out of range" serve --load "$TMP/ck" --port 70000
# This machine has no GPU (the CLI tests run on the CPU).
expect_error "--device cuda: no GPU is visible" serve --load "$TMP/ck" --device cuda
expect_error "--cuda-graphs needs --device cuda" serve --load "$TMP/ck" --device cpu --cuda-graphs
expect_error "--device" serve --load "$TMP/ck" --device tpu
expect_error "--max-prompt-tokens 64 exceeds the model's context of 16 tokens: use 16 or less" \
  serve --load "$TMP/ck" --max-prompt-tokens 64 --port 0
expect_error "--max-tokens-to-generate 17 exceeds the model's context of 16" \
  serve --load "$TMP/ck" --max-tokens-to-generate 17 --port 0
expect_error "--max-tokens-to-generate: value out of range" serve --load "$TMP/ck" --max-tokens-to-generate 0
expect_error "--max-concurrent-requests: value out of range" serve --load "$TMP/ck" --max-concurrent-requests 0
expect_error "--max-body-bytes: value out of range" serve --load "$TMP/ck" --max-body-bytes 10
expect_error "--request-timeout must be > 0 seconds" serve --load "$TMP/ck" --request-timeout 0
expect_error "--shutdown-timeout must be >= 0 seconds" serve --load "$TMP/ck" --shutdown-timeout -1
expect_error "--host 256.1.1.1: cannot listen" serve --load "$TMP/ck" --host 256.1.1.1 --port 0
expect_error "unknown flag --max-prompt-token (did you mean --max-prompt-tokens?)" serve --load "$TMP/ck" --max-prompt-token 5
check "the checkpoint is intact" [ "$(tree_sum "$TMP/ck")" = "$before" ]
finish
