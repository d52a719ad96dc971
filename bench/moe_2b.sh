# Sourced by the bench scripts: DESIGN.md's moe-2b benchmark shape (llama-1.5b's attention and
# vocabulary; every MLP an MoE block of 8 SwiGLU experts of ffn 2048, top-2 softmax router,
# aux-loss 1e-2; micro-batch 4, sequence 2048), one definition for every script.
# shellcheck disable=SC2034
source "$(dirname "${BASH_SOURCE[0]}")/llama_1_5b.sh"
MOE_2B=("${LLAMA_1_5B[@]}" --num-experts 8 --moe-ffn-hidden-size 2048 --moe-router-topk 2
        --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm
        --moe-token-dispatcher-type alltoall)
