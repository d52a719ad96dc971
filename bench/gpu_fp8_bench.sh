#!/usr/bin/env bash
# FP8 against bf16 on one GPU (issue #18), all in one device call so that the ratio compares like
# with like: llama-1.5b trained in bf16, FP8 delayed and FP8 tensorwise (hybrid: E4M3 forward,
# E5M2 gradients; real FP8 GEMMs through cuBLASLt), one JSON line each with tokens/s, peak
# memory and the ratios to bf16; then one run with --log-op-breakdown of the faster FP8 recipe
# (the breakdown names the "FP8 casts": cast + transpose + amax, the cost FP8 adds).
# Expects the build of bench/gpu_bench.sh in $MT_DEVICE_BUILD (or builds megatron there).
#   MT_BENCH_ITERS   iterations per run (default 20; the median of those after the first 5)
#   MT_FP8_RECIPES   recipes to run (default "delayed tensorwise"; blockwise runs cuBLASLt's
#                    block-scaled GEMMs in E4M3 throughout, Transformer Engine's blockwise default)
#   MT_FP8_AB=1      each recipe also with MT_FP8_UNFUSED=1 (the casts without the producer
#                    fusion, model/fp8.h): the fusion's gain measured on the same machine
#   MT_FP8_TUNE_AB=1 each recipe also with MT_FP8_GEMM_TUNE=0 (the FP8 GEMMs on the heuristic's
#                    first choice, the bf16 ones still tuned; "-no-fp8-tune" in the bench name):
#                    the FP8 GEMM autotuning's gain (kernels/cuda/fp8_lt.h) on the same card
#   MT_FP8_CAST_AB=1 each recipe also with MT_FP8_CAST_KERNEL=tile (the casts' shared-memory tile
#                    kernels instead of the lane blocks, kernels/cuda/fp8_cast_kernel.h; "-smem-casts")
#   MT_FP8_OVERLAP_AB=1 each per-tensor recipe also with MT_FP8_WGRAD_OVERLAP=1 (the weight
#                    gradients' GEMMs on side streams beside the backward, model/fp8.h; "-wgrad-overlap")
#   MT_FP8_BF16_BREAKDOWN=0 no bf16 breakdown run (its split is known; saves a run)
#   MT_FP8_OPTIN=1   tensorwise also with each switch of model/fp8.h (Fp8Switches) flipped from its
#                    default ("-no-fused-scale", "-no-wt-from-codes", "-swiglu-grad-codes" in the
#                    bench name), the default path's line first: old and new in one call on one
#                    card; the breakdown then also runs with the two default-on switches off
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_BENCH_ITERS:-20}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ ! -x "$B/bin/megatron" ]; then
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 && cmake --build "$B" -j"$(nproc)" --target megatron >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -20; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
M="$B/bin/megatron"
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# run NAME ARGS...: trains llama-1.5b, prints the JSON line; leaves tokens/s and peak GiB in TOK, MEM.
run() {
  local name=$1; shift
  "$M" pretrain "${LLAMA_1_5B[@]}" --global-batch-size 32 "$@" --mock-data --bf16 --device cuda \
    --train-iters "$ITERS" --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --clip-grad 1.0 \
    --attention-dropout 0 --hidden-dropout 0 --data-cache-path /tmp/mt_cache >"$OUT/$name.txt" 2>&1
  local rc=$?
  TOK=0; MEM=0
  [ $rc -ne 0 ] && { echo "$name failed (rc $rc)"; grep -iE "error" "$OUT/$name.txt" | head -3; tail -3 "$OUT/$name.txt"; return; }
  local lines; lines=$(grep '^ iteration' "$OUT/$name.txt" | tail -n +6)
  TOK=$(echo "$lines" | sed -E 's/.*tokens per second: ([0-9]+).*/\1/' | median)
  local ms; ms=$(echo "$lines" | sed -E 's/.*iteration \(ms\): ([0-9.]+).*/\1/' | median)
  local loss; loss=$(grep '^ iteration' "$OUT/$name.txt" | tail -1 | sed -E 's/.*lm loss: ([0-9.E+-]+).*/\1/')
  MEM=$(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" | awk '{print $4}')
  printf '{"bench":"llama-1.5b-%s","device":"%s","tokens_per_s":%s,"speedup_vs_bf16":%s,"peak_mem_gib":%s,"mem_vs_bf16":%s,"step_time_median_ms":%s,"last_loss":%s,"iters":%s,"commit":"%s"}\n' \
    "$name" "$GPU" "$TOK" "$(awk -v a="$TOK" -v b="${BF16_TOK:-0}" 'BEGIN {print (b > 0 ? sprintf("%.3f", a / b) : "null")}')" \
    "${MEM:-null}" "$(awk -v a="${MEM:-0}" -v b="${BF16_MEM:-0}" 'BEGIN {print (b > 0 ? sprintf("%.3f", a / b) : "null")}')" \
    "$ms" "${loss:-null}" "$ITERS" "$COMMIT"
  grep -E "fp8 saturated" "$OUT/$name.txt" | tail -1 | grep -oE 'fp8 [^|]*\|[^|]*\|' || true
}

# fp8_args RECIPE: the FP8 flags of a run (delayed: Megatron's usual long history and its max).
fp8_args() {
  if [ "$1" = blockwise ]; then echo --fp8-format e4m3 --fp8-recipe blockwise; return; fi
  echo --fp8-format hybrid --fp8-recipe "$1"
  [ "$1" = delayed ] && echo --fp8-amax-history-len 1024 --fp8-amax-compute-algo max
}

BF16_TOK=; BF16_MEM=
run bf16
BF16_TOK=$TOK; BF16_MEM=$MEM
best=; best_tok=0
for recipe in ${MT_FP8_RECIPES:-delayed tensorwise}; do
  # shellcheck disable=SC2046
  run "fp8-$recipe" $(fp8_args "$recipe")
  if [ "${TOK:-0}" -gt "$best_tok" ]; then best=$recipe; best_tok=$TOK; fi
  # shellcheck disable=SC2046
  [ "${MT_FP8_AB:-0}" = 1 ] && MT_FP8_UNFUSED=1 run "fp8-$recipe-unfused" $(fp8_args "$recipe")
  # shellcheck disable=SC2046
  [ "${MT_FP8_TUNE_AB:-0}" = 1 ] && MT_FP8_GEMM_TUNE=0 run "fp8-$recipe-no-fp8-tune" $(fp8_args "$recipe")
  # shellcheck disable=SC2046
  [ "${MT_FP8_CAST_AB:-0}" = 1 ] && MT_FP8_CAST_KERNEL=tile run "fp8-$recipe-smem-casts" $(fp8_args "$recipe")
  # shellcheck disable=SC2046
  [ "${MT_FP8_OVERLAP_AB:-0}" = 1 ] && [ "$recipe" != blockwise ] &&
    MT_FP8_WGRAD_OVERLAP=1 run "fp8-$recipe-wgrad-overlap" $(fp8_args "$recipe")
  if [ "${MT_FP8_OPTIN:-0}" = 1 ] && [ "$recipe" = tensorwise ]; then
    # shellcheck disable=SC2046
    MT_FP8_FUSED_SCALE=0 run "fp8-$recipe-no-fused-scale" $(fp8_args "$recipe")
    # shellcheck disable=SC2046
    MT_FP8_WT_FROM_CODES=0 run "fp8-$recipe-no-wt-from-codes" $(fp8_args "$recipe")
    # shellcheck disable=SC2046
    MT_FP8_SWIGLU_GRAD_CODES=1 run "fp8-$recipe-swiglu-grad-codes" $(fp8_args "$recipe")
  fi
done
# Where the time goes, bf16 and the faster FP8 recipe (CUDA events cost a few percent: own runs).
ITERS=$(( ITERS < 12 ? ITERS : 12 ))
BF16_TOK=; BF16_MEM=
if [ "${MT_FP8_BF16_BREAKDOWN:-1}" != 0 ]; then
  run bf16-timed --log-op-breakdown >/dev/null
  grep "time breakdown" "$OUT/bf16-timed.txt" | tail -1 | sed 's/^/bf16: /'
fi
if [ -n "$best" ]; then
  # shellcheck disable=SC2046
  run "fp8-$best-timed" $(fp8_args "$best") --log-op-breakdown >/dev/null
  grep "time breakdown" "$OUT/fp8-$best-timed.txt" | tail -1 | sed "s/^/fp8 $best: /"
  if [ "${MT_FP8_OPTIN:-0}" = 1 ] && [ "$best" = tensorwise ]; then
    # shellcheck disable=SC2046
    MT_FP8_FUSED_SCALE=0 MT_FP8_WT_FROM_CODES=0 run "fp8-$best-switches-off-timed" $(fp8_args "$best") --log-op-breakdown >/dev/null
    grep "time breakdown" "$OUT/fp8-$best-switches-off-timed.txt" | tail -1 | sed "s/^/fp8 $best switches off: /"
  fi
fi
