#!/usr/bin/env bash
# Long-sequence benchmark (issue #19), run on one GPU from the repository root:
#   bash bench/gpu_longseq_bench.sh
# 1. llama-1.5b at sequence 8k, 16k and 32k (micro-batch 1): for each, the first recompute
#    setting that fits, tried in the order none, selective, full (uniform, 1 layer per group),
#    prints one JSON line: tokens/s, MFU, peak memory, attention's share of the op time
#    (--log-op-breakdown), the recompute used. --distribute-saved-activations needs TP > 1 (it
#    splits a recomputed group's input over the TP ranks), so it does not apply on one GPU.
# 2. The attention anchor at seq 32k, batch 1, llama-1.5b's heads, bf16, causal, forward +
#    backward: torch's scaled_dot_product_attention (flash and cuDNN backends; FA3 when
#    installed) against our attention op (cuda_ops_bench --only=longattn: our flash kernels and
#    our cuDNN graph, and a packed sequence through the ranged kernels), and the ratio of our
#    best to torch's best (target >= 0.6).
# Env: MT_LONGSEQ_SEQS (default "8192 16384 32768"), MT_LONGSEQ_RECOMPUTE (one of
# none|selective|full: only that), MT_BENCH_ITERS (default 6), MT_SKIP_BUILD=1 (reuse the build),
# MT_SKIP_TRAIN=1 / MT_SKIP_ANCHOR=1. Logs go to $OUT (or /tmp/mt_out).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_BENCH_ITERS:-6}
SEQS=${MT_LONGSEQ_SEQS:-8192 16384 32768}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
PEAK_TFLOPS=${MT_PEAK_TFLOPS:-989}  # H100 SXM dense bf16
echo "device: $GPU, commit $COMMIT"
if [ -z "${MT_SKIP_BUILD:-}" ]; then
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 || { echo "configure failed"; grep -A8 "CMake Error" "$OUT/configure.txt" | head -40; exit 1; }
  cmake --build "$B" -j"$(nproc)" --target megatron cuda_ops_bench >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -30; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
M="$B/bin/megatron"

# The llama-1.5b shape with the sequence length and micro-batch replaced (later flags win).
longseq_run() {  # longseq_run NAME SEQ RECOMPUTE
  local name=$1 seq=$2 rc_mode=$3 extra=()
  case $rc_mode in
    selective) extra=(--recompute-granularity selective) ;;
    full) extra=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1) ;;
  esac
  "$M" pretrain "${LLAMA_1_5B[@]}" --seq-length "$seq" --max-position-embeddings "$seq" --micro-batch-size 1 \
    --global-batch-size 1 "${extra[@]}" --mock-data --bf16 --device cuda --train-iters "$ITERS" --log-interval 1 \
    --eval-iters 0 --no-progress-bar --lr 1e-4 --clip-grad 1.0 --attention-dropout 0 --hidden-dropout 0 \
    --log-op-breakdown --data-cache-path /tmp/mt_cache >"$OUT/$name.txt" 2>&1
}

report_run() {  # report_run NAME SEQ RECOMPUTE: one JSON line from the run's log
  local name=$1 seq=$2 rc_mode=$3
  # Median over the iterations after the first 2 (warm-up: graphs, GEMM tuning, allocator).
  grep '^ iteration' "$OUT/$name.txt" | tail -n +3 |
    sed -E 's/.*iteration \(ms\): ([0-9.]+).*TFLOP\/s(\/GPU)?\): ([0-9.]+).*tokens per second: ([0-9]+).*/\1 \3 \4/' |
    sort -n >"$OUT/$name.ms"
  local k; k=$(wc -l <"$OUT/$name.ms")
  read -r ms tf tok < <(sed -n "$(( (k + 1) / 2 ))p" "$OUT/$name.ms")
  local mem; mem=$(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" | tail -1 | awk '{print $4}')
  local attn; attn=$(grep "time breakdown" "$OUT/$name.txt" | tail -1 | grep -oE 'attention [0-9.]+%' | grep -oE '[0-9.]+')
  printf '{"bench":"llama-1.5b-seq%s","device":"%s","seq":%s,"micro_batch":1,"recompute":"%s","tokens_per_s":%s,"model_tflops":%s,"mfu_pct":%.1f,"peak_mem_gib":%s,"attention_share_pct":%s,"step_time_median_ms":%s,"iters":%s,"commit":"%s"}\n' \
    "$seq" "$GPU" "$seq" "$rc_mode" "${tok:-null}" "${tf:-null}" "$(echo "${tf:-0}" | awk -v p="$PEAK_TFLOPS" '{print 100 * $1 / p}')" \
    "${mem:-null}" "${attn:-null}" "${ms:-null}" "$ITERS" "$COMMIT"
  grep "time breakdown" "$OUT/$name.txt" | tail -1
}

if [ -z "${MT_SKIP_TRAIN:-}" ]; then
  for seq in $SEQS; do
    fitted=""
    for rc_mode in ${MT_LONGSEQ_RECOMPUTE:-none selective full}; do
      name="longseq_${seq}_${rc_mode}"
      if longseq_run "$name" "$seq" "$rc_mode"; then
        report_run "$name" "$seq" "$rc_mode"
        fitted=1
        break
      fi
      echo "seq $seq, recompute $rc_mode: failed ($(grep -iE 'error|out of memory' "$OUT/$name.txt" | tail -1 | cut -c1-160))"
    done
    [ -z "$fitted" ] && printf '{"bench":"llama-1.5b-seq%s","device":"%s","seq":%s,"error":"no recompute setting fitted"}\n' \
      "$seq" "$GPU" "$seq"
  done
fi

if [ -z "${MT_SKIP_ANCHOR:-}" ]; then
  ASEQ=${MT_ANCHOR_SEQ:-32768}
  python3 bench/torch_sdpa_anchor.py --seq "$ASEQ" | tee "$OUT/anchor_torch.jsonl"
  "$B/bin/cuda_ops_bench" --only=longattn --seq="$ASEQ" | tee "$OUT/anchor_ours.txt" | grep '^{'
  # Ours: the better of our flash kernels and our cuDNN graph (what --attention-backend picks
  # between); theirs: the best torch backend. Both in the same FLOP count.
  ours=$(grep -E '"op":"attn_fwd_bwd(_cudnn)?"' "$OUT/anchor_ours.txt" | grep -oE '"TFLOP/s":[0-9.]+' | cut -d: -f2 |
    sort -g | tail -1)
  theirs=$(grep -oE '"fwd_bwd_tflops": [0-9.]+' "$OUT/anchor_torch.jsonl" | awk '{print $2}' | sort -g | tail -1)
  awk -v o="${ours:-0}" -v t="${theirs:-0}" -v s="$ASEQ" -v g="$GPU" -v c="$COMMIT" 'BEGIN {
    r = t > 0 ? o / t : 0
    printf "{\"bench\":\"attention_anchor\",\"device\":\"%s\",\"seq\":%d,\"ours_fwd_bwd_tflops\":%.1f,\"torch_best_fwd_bwd_tflops\":%.1f,\"ratio\":%.3f,\"target\":0.6,\"meets_target\":%s,\"commit\":\"%s\"}\n",
      g, s, o, t, r, (r >= 0.6 ? "true" : "false"), c }'
fi
