#!/usr/bin/env bash
# TikTokenizer through the CLI: preprocess with Megatron's JSON vocabulary (the committed
# fixture) writes the ids the tokenizer gives, pretrain trains on them; wrong flags and files are
# one error line naming the flag or file, and the data written before stays intact.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
V="$SRC/tests/data/tiktoken/vocab.json"
TIK=(--tokenizer-type TikTokenizer --tokenizer-model "$V" --vocab-size 2000 --tiktoken-num-special-tokens 100)

for i in $(seq 1 40); do echo "{\"text\": \"Story $i: the model reads about number $((i * 37 % 101)) and learns.\"}"; done \
  >"$TMP/c.jsonl"
mkdir -p "$TMP/data"
check "preprocess with TikTokenizer" "$MEGATRON" preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/data/c" \
  "${TIK[@]}" --tiktoken-pattern v1 --append-eod --workers 1
SUM=$(tree_sum "$TMP/data")
"$MEGATRON" inspect-data --info "$TMP/data/c_text_document" >"$TMP/info" 2>&1
check "40 documents written" grep -q "\"documents\":40," "$TMP/info"
"$MEGATRON" inspect-data --info "$TMP/data/c_text_document" --document 6 "${TIK[@]}" --tiktoken-pattern v1 \
  >"$TMP/doc" 2>&1
check "inspect-data decodes a TikTokenizer document" grep -q "Story 7: the model reads about number 57 and learns." "$TMP/doc"
"$MEGATRON" pretrain --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 \
  --train-iters 2 --lr 1e-3 --data-path "$TMP/data/c_text_document" --split 90,10,0 --eval-iters 1 --device cpu \
  --no-progress-bar --log-interval 1 "${TIK[@]}" --tiktoken-pattern v1 --data-cache-path "$TMP/cache" >"$TMP/run" 2>&1
check "pretrain with TikTokenizer trains" grep -qE "iteration +2/ +2 \|" "$TMP/run"

expect_error "--tiktoken-pattern" pretrain --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --micro-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data "${TIK[@]}" --tiktoken-pattern v3
expect_error "--tokenizer-special-tokens is read only by --tokenizer-type TikTokenizer" pretrain --num-layers 1 \
  --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --train-iters 2 --lr 1e-3 \
  --mock-data --tokenizer-type NullTokenizer --vocab-size 64 --tokenizer-special-tokens "<s>"
expect_error "fewer than --vocab-size (131072)" preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/data/d" \
  --tokenizer-type TikTokenizer --tokenizer-model "$V"
expect_error "--tokenizer-special-tokens must include <mask>" preprocess --input "$TMP/c.jsonl" \
  --output-prefix "$TMP/data/d" "${TIK[@]}" --tokenizer-special-tokens "<unk>" "<s>" "</s>"
expect_error "needs --tokenizer-model" preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/data/d" \
  --tokenizer-type TikTokenizer
printf '{"not": "a list"}' >"$TMP/bad.json"
expect_error "$TMP/bad.json: expected Megatron's TikTokenizer vocabulary" preprocess --input "$TMP/c.jsonl" \
  --output-prefix "$TMP/data/d" --tokenizer-type TikTokenizer --tokenizer-model "$TMP/bad.json" --vocab-size 2000 \
  --tiktoken-num-special-tokens 100
check "the data written before is intact" test "$(tree_sum "$TMP/data")" = "$SUM"
finish
