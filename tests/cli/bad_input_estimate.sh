#!/usr/bin/env bash
# `megatron estimate`: every user mistake gives one clear line naming the flag and a non-zero
# exit, and a good run prints its report without touching a GPU or any data.
# usage: bad_input_estimate.sh MEGATRON SOURCE_DIR
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"

S=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --micro-batch-size 2 --vocab-size 1000)

# Its own flags.
expect_error "--world-size 3 is not divisible by --tensor-model-parallel-size (2)" estimate "${S[@]}" --world-size 3 --tensor-model-parallel-size 2
expect_error "--world-size: value out of range" estimate "${S[@]}" --world-size 0
expect_error "--world-size" estimate "${S[@]}" --world-size two
for g in abc -1 0 inf nan 1e9 80GiB; do
  expect_error "--gpu-memory-gib got '$g'" estimate "${S[@]}" --gpu-memory-gib "$g"
done
expect_error "did you mean --gpu-memory-gib?" estimate "${S[@]}" --gpu-memroy-gib 80
expect_error "unknown command 'estimat' (did you mean 'estimate'?)" estimat "${S[@]}"
# The vocabulary: --vocab-size or a tokenizer with readable files.
expect_error "the vocabulary size is needed: give --vocab-size N" estimate --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128
expect_error "--vocab-file: cannot open" estimate "${S[@]}" --tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/none.json" --merge-file "$TMP/none.bpe"
# Pretrain's own rules apply unchanged.
expect_error "--num-attention-heads (4) must be divisible by --tensor-model-parallel-size (3)" estimate "${S[@]}" --tensor-model-parallel-size 3 --world-size 3
expect_error "--global-batch-size (3) is not divisible by --micro-batch-size (2)" estimate "${S[@]}" --global-batch-size 3
expect_error "--device cuda trains in bf16 or fp16: add --bf16" estimate "${S[@]}" --device cuda
expect_error "--recompute-granularity full needs --recompute-method" estimate "${S[@]}" --recompute-granularity full
expect_error "--expert-model-parallel-size" estimate "${S[@]}" --num-experts 3 --expert-model-parallel-size 2 --world-size 2
# Context parallelism is modelled (pretrain refuses it for now), with Megatron's sequence rule.
expect_error "--seq-length 128 must be divisible by 2 x --context-parallel-size 3 = 6" estimate "${S[@]}" --context-parallel-size 3 --world-size 3

# Good runs: a report, exit 0, no GPU needed; a run too big for the GPU says so and suggests a layout.
check "estimate prints a report" bash -c '"$0" estimate "$@" | grep -q "^fits: "' "$MEGATRON" "${S[@]}"
check "context parallel is accepted" bash -c '"$0" estimate "$@" --context-parallel-size 2 --world-size 4 | grep -q "CP 2 x DP 2"' "$MEGATRON" "${S[@]}"
L8=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --ffn-hidden-size 14336 --seq-length 4096 --normalization RMSNorm --swiglu --position-embedding-type rope
    --disable-bias-linear --untie-embeddings-and-output-weights --vocab-size 128255 --micro-batch-size 1 --bf16)
check "too big: says so and suggests a layout that fits" bash -c \
  'out=$("$0" estimate "$@" --world-size 8 --global-batch-size 8); echo "$out" | grep -q "^DOES NOT FIT" && echo "$out" | grep -q "fits with --"' \
  "$MEGATRON" "${L8[@]}"
finish
