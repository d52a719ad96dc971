#!/usr/bin/env bash
# generate --tensor-model-parallel-size 2 under megatron launch (#22: TP > 1): a checkpoint saved
# at TP 1 is resharded on load, both ranks step their engines together, rank 0 prints, and the
# greedy and seeded outputs equal the single-rank ones. Without the ranks, one clear error.
set -u
MEGATRON=$1
source "$2/tests/cli/lib/expect.bash"
export OMP_NUM_THREADS=1 MASTER_PORT=29573
"$MEGATRON" pretrain --num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention \
  --num-query-groups 2 --seq-length 32 --max-position-embeddings 32 --position-embedding-type rope \
  --normalization RMSNorm --swiglu --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --mock-data \
  --vocab-size 100 --train-iters 3 --eval-iters 0 --seed 5 --no-progress-bar --data-cache-path "$TMP/cache" \
  --save "$TMP/ckpt" >"$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; exit 1; }
printf '%s\n' '{"prompt": "1 2 3", "max_new_tokens": 8, "temperature": 0}' \
  '{"prompt": "4 5 6 7 8 9", "max_new_tokens": 6, "seed": 11, "temperature": 0.9, "top_k": 20}' \
  '{"prompt": "10", "max_new_tokens": 10, "temperature": 0}' >"$TMP/prompts.jsonl"
G=(generate --load "$TMP/ckpt" --prompts-file "$TMP/prompts.jsonl" --device cpu --max-batch 2)
"$MEGATRON" "${G[@]}" --output "$TMP/one.jsonl" >"$TMP/one.log" 2>&1
check "one rank generates" test -s "$TMP/one.jsonl"
timeout 120 "$MEGATRON" launch --nproc-per-node 2 -- "${G[@]}" --tensor-model-parallel-size 2 --output "$TMP/tp2.jsonl" \
  >"$TMP/tp2.log" 2>&1
check "TP 2 generates (exit 0)" [ $? = 0 ]
check "TP 2 writes what one rank writes, greedy and seeded" cmp -s "$TMP/one.jsonl" "$TMP/tp2.jsonl"
[ $fails -eq 0 ] || { cat "$TMP/tp2.log"; diff "$TMP/one.jsonl" "$TMP/tp2.jsonl"; }
expect_error "--tensor-model-parallel-size 2 runs as 2 ranks, but this job has 1" "${G[@]}" \
  --tensor-model-parallel-size 2
finish
