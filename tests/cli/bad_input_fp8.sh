#!/usr/bin/env bash
# FP8 flags (issue #18): Megatron's names and choices, the recipes' own options, Blackwell-only
# formats refused by name, and the combinations Megatron forbids. Each mistake is one line on
# stderr naming the flag; a checkpoint in place before the failing commands is left as it was.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu)

"$MEGATRON" pretrain "${BASE[@]}" --tokenizer-type NullTokenizer --save "$TMP/ck" --save-interval 2 \
  >"$TMP/train.log" 2>&1 || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")
SAVE=(--save "$TMP/ck" --load "$TMP/ck" --save-interval 1)
FP8=(--fp8-format hybrid)

expect_error "--fp8-format got 'e4m2'; expected e4m3 or hybrid" pretrain "${BASE[@]}" --fp8-format e4m2
expect_error "--fp8-format e5m2 is not a Megatron choice" pretrain "${BASE[@]}" --fp8-format e5m2
expect_error "--fp8-recipe mxfp8 needs Blackwell" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe mxfp8
expect_error "--fp8-recipe custom loads a Python quantizer factory" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe custom
expect_error "--fp8-recipe got 'current'; expected delayed, tensorwise or blockwise" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe current
expect_error "--fp4-format is a Megatron-LM flag" pretrain "${BASE[@]}" --fp4-format nvfp4
expect_error "NVFP4 needs Blackwell" pretrain "${BASE[@]}" --fp4-format nvfp4
expect_error "--fp8-dot-product-attention is a Megatron-LM flag" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-dot-product-attention
expect_error "--fp8-amax-compute-algo got 'mean'; expected max or most_recent" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-amax-compute-algo mean
expect_error "--fp8-amax-history-len: value out of range" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-amax-history-len 0
expect_error "--fp8-margin: value out of range" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-margin -1
expect_error "--fp8-recipe needs --fp8-format" pretrain "${BASE[@]}" --fp8-recipe tensorwise
expect_error "--no-fp8-wgrad needs --fp8-format" pretrain "${BASE[@]}" --no-fp8-wgrad
expect_error "--fp8-amax-history-len applies to --fp8-recipe delayed only" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe tensorwise --fp8-amax-history-len 16
expect_error "--fp8-margin applies to --fp8-recipe delayed only" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe blockwise --fp8-margin 1
expect_error "--fp8-param-gather needs --use-distributed-optimizer (Megatron's rule: the optimizer's fp32 shards are cast to FP8 and gathered): add --use-distributed-optimizer, or drop --fp8-param-gather" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-param-gather
expect_error "--fp8-param-gather needs --fp8-format" pretrain "${BASE[@]}" --use-distributed-optimizer --fp8-param-gather
expect_error "--fp8-param-gather works with the per-tensor recipes" pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe blockwise --use-distributed-optimizer --fp8-param-gather
expect_error "--first-last-layers-bf16 does not work with --fp8-recipe delayed" pretrain "${BASE[@]}" "${FP8[@]}" --first-last-layers-bf16
expect_error "--num-layers-at-start-in-bf16 needs --first-last-layers-bf16" pretrain "${BASE[@]}" "${FP8[@]}" --num-layers-at-start-in-bf16 1
expect_error "--num-layers-at-end-in-bf16 (3) must be at most the layers per pipeline stage (2)" \
  pretrain "${BASE[@]}" "${FP8[@]}" --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-end-in-bf16 3
expect_error "--fp8-format got 'hybrid2'" pretrain "${BASE[@]}" "${SAVE[@]}" --fp8-format hybrid2
expect_error "--fp8-recipe needs --fp8-format" pretrain "${BASE[@]}" "${SAVE[@]}" --fp8-recipe blockwise
check "the checkpoint is intact after the failing commands" [ "$(tree_sum "$TMP/ck")" = "$before" ]
finish
