#!/usr/bin/env bash
# Mixture-of-experts flags (issue #17): Megatron's --num-experts / --moe-* rules and the flags
# megatron.cpp refuses by name. Each mistake is one line on stderr naming the flag and a non-zero
# exit; a checkpoint in place before the failing commands is left as it was.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu)
MOE=("${BASE[@]}" --num-experts 4)

"$MEGATRON" pretrain "${BASE[@]}" --tokenizer-type NullTokenizer --save "$TMP/ck" --save-interval 2 \
  >"$TMP/train.log" 2>&1 || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")
CK=(--load "$TMP/ck" --save "$TMP/ck" --save-interval 1)

# --moe-layer-freq: an integer or a list expression, parsed (never evaluated as Python).
expect_error "--moe-layer-freq: cannot add a list and an integer at position 4 in '[1]+2'" \
  pretrain "${MOE[@]}" "${CK[@]}" --moe-layer-freq '[1]+2'
expect_error "--moe-shared-expert-overlap needs --moe-token-dispatcher-type alltoall" \
  pretrain "${MOE[@]}" --moe-shared-expert-intermediate-size 16 --moe-shared-expert-overlap
expect_error "--moe-layer-freq: unexpected '_' at position 1 in '__import__(\"os\")'" \
  pretrain "${MOE[@]}" --moe-layer-freq '__import__("os")'
expect_error "--moe-layer-freq: the pattern would have more than 65536 entries" \
  pretrain "${MOE[@]}" --moe-layer-freq '[1]*1000000'
expect_error "--moe-layer-freq: entry 1 of the pattern '[1,2,0,0]' is 2; entries must be 0 (dense) or 1 (MoE)" \
  pretrain "${MOE[@]}" --moe-layer-freq '[1,2,0,0]'
expect_error "--moe-layer-freq: the pattern has 12 entries but the model has 4 layers (--num-layers)" \
  pretrain "${MOE[@]}" "${CK[@]}" --moe-layer-freq '([1]*3+[0]*1)*3'
expect_error "--moe-layer-freq: the frequency must be at least 1 (got '0')" pretrain "${MOE[@]}" --moe-layer-freq 0
printf 'num_experts: 4\nmoe_layer_freq: "[1,0"\n' >"$TMP/moe.yaml"
expect_error "--config $TMP/moe.yaml: --moe-layer-freq: expected ',' or ']' at position 5" \
  pretrain "${BASE[@]}" --config "$TMP/moe.yaml"

# Refused by name: what megatron.cpp does not implement.
expect_error "--moe-router-dtype fp64 is not supported: megatron.cpp routes in fp32" \
  pretrain "${MOE[@]}" --moe-router-dtype fp64
expect_error "--moe-token-dispatcher-type flex (DeepEP / HybridEP) is not supported" \
  pretrain "${MOE[@]}" --moe-token-dispatcher-type flex
expect_error "--moe-router-load-balancing-type global_aux_loss is not implemented yet" \
  pretrain "${MOE[@]}" --moe-router-load-balancing-type global_aux_loss
expect_error "--moe-router-load-balancing-type quantile_balancing is not implemented yet" \
  pretrain "${MOE[@]}" --moe-router-load-balancing-type quantile_balancing
expect_error "--moe-input-jitter-eps is a Megatron-LM flag that megatron.cpp does not support yet" \
  pretrain "${MOE[@]}" --moe-input-jitter-eps 0.01
expect_error "--moe-router-topk-limited-devices is a Megatron-LM flag that megatron.cpp does not support yet" \
  pretrain "${MOE[@]}" --moe-router-topk-limited-devices 2

# MoE flags need experts.
expect_error "--moe-router-topk needs --num-experts" pretrain "${BASE[@]}" "${CK[@]}" --moe-router-topk 2
expect_error "--expert-model-parallel-size 2 needs --num-experts" pretrain "${BASE[@]}" --expert-model-parallel-size 2
expect_error "--moe-use-upcycling needs --save" pretrain "${MOE[@]}" --moe-use-upcycling

# Megatron's TransformerConfig rules.
expect_error "--num-experts: value out of range (got 100000; expected 1 to 65536)" pretrain "${BASE[@]}" --num-experts 100000
expect_error "--moe-router-topk: value out of range (got 5; expected 1 to 4)" pretrain "${MOE[@]}" --moe-router-topk 5
expect_error "--moe-router-topk 1 with the softmax score function needs --moe-router-pre-softmax" \
  pretrain "${MOE[@]}" "${CK[@]}" --moe-router-topk 1
expect_error "--moe-aux-loss-coeff must be a finite number, got 'nan'" pretrain "${MOE[@]}" --moe-aux-loss-coeff nan
expect_error "--moe-z-loss-coeff must be a non-negative finite number (got -0.001)" \
  pretrain "${MOE[@]}" --moe-z-loss-coeff -0.001
expect_error "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid" \
  pretrain "${MOE[@]}" --moe-router-enable-expert-bias
expect_error "--moe-router-load-balancing-type sinkhorn does not use an aux loss; drop --moe-aux-loss-coeff" \
  pretrain "${MOE[@]}" --moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0.01
expect_error "--moe-expert-capacity-factor works only with --moe-router-load-balancing-type aux_loss, seq_aux_loss or none (got sinkhorn)" \
  pretrain "${MOE[@]}" --moe-router-load-balancing-type sinkhorn --moe-expert-capacity-factor 1.5
expect_error "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor" \
  pretrain "${MOE[@]}" --moe-pad-expert-input-to-capacity
expect_error "--moe-shared-expert-gate needs a shared expert (--moe-shared-expert-intermediate-size)" \
  pretrain "${MOE[@]}" --moe-shared-expert-gate
expect_error "--num-experts (4) must be divisible by --moe-router-num-groups (3)" \
  pretrain "${MOE[@]}" --moe-router-num-groups 3 --moe-router-group-topk 1
expect_error "--moe-router-group-topk (4) must be at most --moe-router-num-groups (2)" \
  pretrain "${MOE[@]}" --moe-router-num-groups 2 --moe-router-group-topk 4
expect_error "--moe-router-topk (2) must be divisible by --moe-router-group-topk (3)" \
  pretrain "${BASE[@]}" --num-experts 6 --moe-router-num-groups 3 --moe-router-group-topk 3
expect_error "--moe-router-num-groups and --moe-router-group-topk go together" \
  pretrain "${MOE[@]}" --moe-router-num-groups 2
expect_error "--moe-router-topk 4 over --moe-router-group-topk 1 groups takes 4 experts per group, but each of the --moe-router-num-groups 2 groups has only 2" \
  pretrain "${MOE[@]}" --moe-router-topk 4 --moe-router-num-groups 2 --moe-router-group-topk 1

# Parallel rules: checked before any rank connects (a two-rank environment, this rank alone).
export WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 MT_STORE_SECRET=0123456789abcdef0123
expect_error "mixture-of-experts layers with linear biases need --expert-tensor-parallel-size 1" \
  pretrain "${MOE[@]}" --tensor-model-parallel-size 2 --sequence-parallel
expect_error "mixture-of-experts layers with --tensor-model-parallel-size 2 need --sequence-parallel" \
  pretrain "${MOE[@]}" --tensor-model-parallel-size 2 --disable-bias-linear
expect_error "mixture-of-experts layers with linear biases need --expert-tensor-parallel-size 1 (Megatron's rule; the experts' TP size is 2)" \
  pretrain "${MOE[@]}" --expert-model-parallel-size 1 --expert-tensor-parallel-size 2
expect_error "--num-experts (4) must be divisible by --expert-model-parallel-size (3)" \
  pretrain "${MOE[@]}" --expert-model-parallel-size 3
expect_error "--expert-tensor-parallel-size (1) x --expert-model-parallel-size (4) must divide the 2 ranks of a pipeline stage" \
  pretrain "${MOE[@]}" --expert-model-parallel-size 4
expect_error "--expert-tensor-parallel-size (4) x --expert-model-parallel-size (1) must divide the 2 ranks of a pipeline stage" \
  pretrain "${MOE[@]}" "${CK[@]}" --disable-bias-linear --expert-tensor-parallel-size 4
unset WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT MT_STORE_SECRET

# --load HF_DIR: the experts come from config.json; flags that say otherwise are named.
FIX=$2/tests/checkpoint/fixtures
HF=(--seq-length 8 --micro-batch-size 2 --train-iters 2 --lr 1e-4 --mock-data --eval-iters 0 --no-progress-bar
    --device cpu --tokenizer-type NullTokenizer --vocab-size 99)
expect_error "--num-experts 8 conflicts with $FIX/qwen2_moe/config.json (num_experts / num_local_experts = 4)" \
  pretrain "${HF[@]}" --load "$FIX/qwen2_moe" --num-experts 8
expect_error "--moe-layer-freq conflicts with $FIX/qwen2_moe/config.json (decoder_sparse_step / mlp_only_layers)" \
  pretrain "${HF[@]}" --load "$FIX/qwen2_moe" --moe-layer-freq 1
expect_error "--moe-router-pre-softmax conflicts with $FIX/mixtral/config.json" \
  pretrain "${HF[@]}" --load "$FIX/mixtral" --moe-router-pre-softmax
expect_error "--num-experts conflicts with $FIX/llama2/config.json (a dense model); drop the flag, or add --moe-use-upcycling" \
  pretrain "${HF[@]}" --load "$FIX/llama2" --num-experts 8
# A dense checkpoint under MoE flags: the first tensor it lacks is named, with the flags to check.
expect_error "tensor 'decoder.layers.0.mlp.router.weight' is missing from checkpoint '$TMP/ck/iter_0000002' (a checkpoint of another model shape? check --num-layers, --swiglu, --untie-embeddings-and-output-weights, --add-qkv-bias, --num-experts, --moe-layer-freq)" \
  pretrain "${MOE[@]}" --tokenizer-type NullTokenizer --load "$TMP/ck"

check "the checkpoint is untouched by the failing runs" [ "$(tree_sum "$TMP/ck")" = "$before" ]
finish
