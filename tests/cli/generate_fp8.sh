#!/usr/bin/env bash
# `megatron generate --fp8-format` (issue #22): FP8 weights quantised at load on the CPU's
# emulation; the startup log names the weights' memory; a checkpoint trained in FP8 says so and
# loads the same way; serve takes the flag too; bad values are refused naming the flag.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --tokenizer-type NullTokenizer --save-interval 2)
"$MEGATRON" pretrain "${BASE[@]}" --save "$TMP/bf" >"$TMP/train.log" 2>&1 ||
  { echo "FAIL: could not train the bf16 fixture"; cat "$TMP/train.log"; exit 1; }
"$MEGATRON" pretrain "${BASE[@]}" --save "$TMP/f8" --fp8-format hybrid >"$TMP/train8.log" 2>&1 ||
  { echo "FAIL: could not train the FP8 fixture"; cat "$TMP/train8.log"; exit 1; }

for ck in bf f8; do
  "$MEGATRON" generate --load "$TMP/$ck" --device cpu --fp8-format e4m3 --prompt "1 2 3 4 5" --max-new-tokens 4 \
    --temperature 0 >"$TMP/$ck.txt" 2>"$TMP/$ck.log"
  check "$ck: generate --fp8-format prints the continuation: $(cat "$TMP/$ck.txt") $(tail -2 "$TMP/$ck.log")" \
    grep -qE '^1 2 3 4 5( [0-9]+){1,4}$' "$TMP/$ck.txt"  # the log shares stdout
  check "$ck: the log names the FP8 weights' memory" grep -q "FP8 weights (e4m3, per-tensor scales): 8 linears.*weight memory" "$TMP/$ck.txt"
done
check "the FP8-trained checkpoint says so" grep -q "trained with FP8" "$TMP/f8.txt"
check "a bf16 checkpoint is quantised without that note" bash -c "! grep -q 'trained with FP8' '$TMP/bf.txt'"
"$MEGATRON" generate --load "$TMP/bf" --device cpu --fp8-format hybrid --prompt "1 2 3 4 5" --max-new-tokens 4 \
  --temperature 0 >"$TMP/hy.txt" 2>/dev/null
check "hybrid is e4m3 for inference (forward operands)" cmp -s "$TMP/hy.txt" "$TMP/bf.txt"

expect_error "--fp8-format" generate --load "$TMP/bf" --device cpu --prompt 1 --fp8-format e5m2
expect_error "--fp8-format" serve --load "$TMP/bf" --device cpu --fp8-format fp8
finish
