#!/usr/bin/env bash
# --moe-use-upcycling (Megatron's): an MoE run starts from a dense checkpoint, saves that start to
# --save at once and trains on; a second run with the flag over that checkpoint is refused, and a
# run without it resumes. (The numbers: tests/checkpoint/upcycle_test.cpp.)
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu --tokenizer-type NullTokenizer
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear --ffn-hidden-size 64
      --attention-dropout 0 --hidden-dropout 0 --log-interval 1)
MOE=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32)  # granularity 2
"$MEGATRON" pretrain "${BASE[@]}" --train-iters 2 --save "$TMP/dense" --save-interval 2 >"$TMP/dense.log" 2>&1 ||
  { echo "FAIL: dense run"; cat "$TMP/dense.log"; exit 1; }
dense=$(tree_sum "$TMP/dense")
if "$MEGATRON" pretrain "${BASE[@]}" "${MOE[@]}" --train-iters 3 --load "$TMP/dense" --save "$TMP/moe" --save-interval 3 \
  --moe-use-upcycling >"$TMP/up.log" 2>&1; then
  grep -q "upcycled the dense checkpoint" "$TMP/up.log" || { echo "FAIL: no upcycling line"; cat "$TMP/up.log"; exit 1; }
  [ -d "$TMP/moe/iter_0000000" ] && [ -d "$TMP/moe/iter_0000003" ] ||
    { echo "FAIL: expected the upcycled start and iteration 3 in --save"; ls "$TMP/moe"; exit 1; }
  [ "$(tree_sum "$TMP/dense")" = "$dense" ] || { echo "FAIL: the dense checkpoint changed"; exit 1; }
else
  echo "FAIL: upcycling run"; cat "$TMP/up.log"; exit 1
fi
expect_error "--moe-use-upcycling: $TMP/moe already holds a checkpoint" \
  pretrain "${BASE[@]}" "${MOE[@]}" --train-iters 4 --load "$TMP/dense" --save "$TMP/moe" --moe-use-upcycling
"$MEGATRON" pretrain "${BASE[@]}" "${MOE[@]}" --train-iters 4 --load "$TMP/moe" --save "$TMP/moe" \
  >"$TMP/resume.log" 2>&1 || { echo "FAIL: resume"; cat "$TMP/resume.log"; exit 1; }
grep -q "iteration        4/" "$TMP/resume.log" || { echo "FAIL: resume did not reach iteration 4"; exit 1; }
mkdir -p "$TMP/empty"
expect_error "--moe-use-upcycling: --load $TMP/empty holds no checkpoint" \
  pretrain "${BASE[@]}" "${MOE[@]}" --train-iters 4 --load "$TMP/empty" --save "$TMP/moe2" --moe-use-upcycling
finish
