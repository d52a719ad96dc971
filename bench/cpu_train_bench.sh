#!/usr/bin/env bash
# CPU training benchmark: the quickstart model shape on mock data. Prints one JSON line
# (DESIGN.md): config, device, tokens/s (median over iterations after warm-up), model TFLOP/s,
# step time median, share of op time in GEMM, peak host memory, git commit.
# usage: bench/cpu_train_bench.sh [ITERS]
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${1:-30}
MEGATRON=${MT_MEGATRON:-build/bin/megatron}  # MT_MEGATRON: another binary (A/B runs)
LOG=$(mktemp)
/usr/bin/time -v $MEGATRON pretrain \
  --num-layers 4 --hidden-size 128 --num-attention-heads 8 --group-query-attention --num-query-groups 4 \
  --ffn-hidden-size 384 --seq-length 128 --max-position-embeddings 128 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
  --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 \
  --mock-data --vocab-size 50257 --micro-batch-size 8 --global-batch-size 16 --train-iters "$ITERS" \
  --lr 3e-3 --log-interval 1 --eval-iters 0 --no-progress-bar --data-cache-path "$LOG.cache" >"$LOG" 2>"$LOG.time"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
CPU=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
# Per-iteration step times after 3 warm-up iterations; the median of them.
grep '^ iteration' "$LOG" | tail -n +4 | sed -E 's/.*iteration \(ms\): ([0-9.]+).*TFLOP\/s\): ([0-9.]+).*/\1 \2/' | sort -n >"$LOG.ms"
K=$(wc -l <"$LOG.ms")
read -r MED_MS MED_TF < <(sed -n "$(( (K + 1) / 2 ))p" "$LOG.ms")
GEMM=$(grep -oE 'GEMM [0-9.]+%' "$LOG" | tail -1 | tr -dc '0-9.')
RSS=$(grep 'Maximum resident' "$LOG.time" | awk '{print $NF}')
awk -v commit="$COMMIT" -v cpu="$CPU" -v cores="$(nproc)" -v ms="$MED_MS" -v tf="$MED_TF" -v gemm="$GEMM" -v rss="$RSS" 'BEGIN {
  printf "{\"bench\":\"cpu-quickstart-shape\",\"config\":{\"layers\":4,\"hidden\":128,\"heads\":8,\"groups\":4,\"ffn\":384,\"seq\":128,\"global_batch\":16,\"vocab\":50304},"
  printf "\"device\":\"%s x%d cores\",\"tokens_per_s\":%.0f,\"model_tflops\":%.4f,\"step_time_median_ms\":%.1f,\"gemm_share_pct\":%s,\"peak_host_mem_mib\":%.0f,\"commit\":\"%s\"}\n",
    cpu, cores, 16 * 128 / (ms / 1000), tf, ms, gemm, rss / 1024, commit }'
rm -rf "$LOG" "$LOG.time" "$LOG.cache" "$LOG.ms"
