# Sourced by the bench scripts: DESIGN.md's llama-1.5b benchmark shape (the Llama-3.2-1B shape
# with an untied head; micro-batch 4, sequence 2048), one definition for every script.
# shellcheck disable=SC2034
LLAMA_1_5B=(--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 8
            --ffn-hidden-size 8192 --seq-length 2048 --max-position-embeddings 2048 --normalization RMSNorm --swiglu
            --position-embedding-type rope --rotary-base 500000 --disable-bias-linear --untie-embeddings-and-output-weights
            --vocab-size 128255 --micro-batch-size 4)
