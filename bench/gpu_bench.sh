#!/usr/bin/env bash
# GPU benchmark and checks, run on the GPU machine from the repository root:
#   scripts/device_prep.sh (here), then on the device: bash bench/gpu_bench.sh
# Builds megatron and the GPU tests, runs `ctest -L gpu`, checks that a bf16 GPU run of a tiny
# model tracks the fp32 CPU run, then times llama-1.5b / gpt2-124m training steps and prints one
# JSON line per benchmark (DESIGN.md). Logs go to $OUT (or /tmp/mt_out).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
# Libraries carried by scripts/device_prep.sh for images that lack them (Gloo's dependencies).
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_BENCH_ITERS:-25}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "device: $GPU, commit $COMMIT"
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
  >"$OUT/configure.txt" 2>&1 || { echo "configure failed"; grep -A8 "CMake Error" "$OUT/configure.txt" | head -40; exit 1; }
cmake --build "$B" -j"$(nproc)" --target megatron test_kernels >"$OUT/build.txt" 2>&1 ||
  { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -30; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
M="$B/bin/megatron"

if [ -z "${MT_SKIP_CTEST:-}" ]; then
  (cd "$B" && timeout 240 ctest -L gpu --output-on-failure >"$OUT/ctest.txt" 2>&1)
  echo "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest.txt")"
fi

# bf16 GPU vs fp32 CPU on one tiny model: the loss trajectories must agree within 1e-2.
TINY=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2
      --seq-length 128 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 --mock-data --vocab-size 1000
      --micro-batch-size 4 --global-batch-size 8 --train-iters ${MT_TRACK_ITERS:-200} --lr 1e-3 --lr-warmup-iters 10
      --log-interval 1 --eval-iters 0 --no-progress-bar --seed 7 --data-cache-path /tmp/mt_cache)
"$M" pretrain "${TINY[@]}" --device cpu >"$OUT/track_cpu.txt" 2>&1
"$M" pretrain "${TINY[@]}" --device cuda --bf16 >"$OUT/track_gpu.txt" 2>&1
paste <(grep -o 'lm loss: [0-9.E+-]*' "$OUT/track_cpu.txt" | awk '{print $3}') \
      <(grep -o 'lm loss: [0-9.E+-]*' "$OUT/track_gpu.txt" | awk '{print $3}') |
  awk '{d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r; n++} END {
    printf "loss tracking: %d steps, max relative difference bf16 GPU vs fp32 CPU %.2e (%s)\n", n, m, (n >= 100 && m < 1e-2) ? "PASS" : "FAIL" }'
tail -3 "$OUT/track_gpu.txt"
[ -n "${MT_TRACK_ONLY:-}" ] && exit 0  # checks only (build, ctest -L gpu, tracking): no timings

bench() {  # bench NAME ARGS...
  local name=$1; shift
  "$M" pretrain "$@" --mock-data --bf16 --device cuda --train-iters "$ITERS" --log-interval 1 --eval-iters 0 \
    --no-progress-bar --lr 1e-4 --clip-grad 1.0 --attention-dropout 0 --hidden-dropout 0 \
    --data-cache-path /tmp/mt_cache >"$OUT/$name.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { echo "$name failed (rc $rc)"; tail -5 "$OUT/$name.txt"; return; }
  # Median over the iterations after the first 5.
  grep '^ iteration' "$OUT/$name.txt" | tail -n +6 |
    sed -E 's/.*iteration \(ms\): ([0-9.]+).*TFLOP\/s\/GPU\): ([0-9.]+).*tokens per second: ([0-9]+).*/\1 \2 \3/' |
    sort -n >"$OUT/$name.ms"
  local k; k=$(wc -l <"$OUT/$name.ms")
  read -r ms tf tok < <(sed -n "$(( (k + 1) / 2 ))p" "$OUT/$name.ms")
  local mem; mem=$(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" | awk '{print $4}')
  printf '{"bench":"%s","device":"%s","tokens_per_s":%s,"model_tflops":%s,"mfu_pct":%.1f,"peak_mem_gib":%s,"step_time_median_ms":%s,"iters":%s,"commit":"%s"}\n' \
    "$name" "$GPU" "$tok" "$tf" "$(echo "$tf" | awk '{print 100 * $1 / 989}')" "${mem:-null}" "$ms" "$ITERS" "$COMMIT"
  grep "time breakdown" "$OUT/$name.txt"
}

bench llama-1.5b "${LLAMA_1_5B[@]}" --global-batch-size 32
# The same with our own flash kernels instead of the automatic choice (cuDNN's fused attention).
[ -n "${MT_AB_FLASH:-}" ] && bench llama-1.5b-flash "${LLAMA_1_5B[@]}" --global-batch-size 32 --attention-backend flash
GPT2=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
      --vocab-size 50257 --micro-batch-size 16 --global-batch-size 16)
bench gpt2-124m "${GPT2[@]}"
# GPT-2 XL shape (1.5B): 48 layers, hidden 1600, 25 heads of 64, LayerNorm, GELU, tied embeddings.
GPT2XL=(--num-layers 48 --hidden-size 1600 --num-attention-heads 25 --seq-length 1024 --max-position-embeddings 1024
        --vocab-size 50257 --micro-batch-size 8 --global-batch-size 8)
bench gpt2-1.5b "${GPT2XL[@]}"
# Where the time goes (CUDA-event op breakdown; costs a few percent, so a run of its own).
bench llama-1.5b-timed "${LLAMA_1_5B[@]}" --global-batch-size 32 --log-op-breakdown
# Per-kernel GPU time of a few llama-1.5b steps (Nsight Systems, when the image has it).
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ -n "${MT_NSYS:-}" ] && [ -n "$NSYS" ]; then
  "$NSYS" profile -o /tmp/mt_prof --force-overwrite true "$M" pretrain "${LLAMA_1_5B[@]}" --global-batch-size 8 \
    --mock-data --bf16 --device cuda --train-iters 4 --log-interval 1 --eval-iters 0 --lr 1e-4 --attention-dropout 0 \
    --hidden-dropout 0 --data-cache-path /tmp/mt_cache >"$OUT/nsys_run.txt" 2>&1
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/mt_prof.nsys-rep >"$OUT/kernels.csv" 2>/dev/null
  echo "top kernels (4 steps of 2 micro-batches; % of GPU kernel time):"
  awk -F, 'NR > 1 && NR < 30 { gsub(/"/, ""); printf "%6s%% %10.1f ms %7s x  %s\n", $1, $2 / 1e6, $3, substr($9, 1, 90) }' "$OUT/kernels.csv"
fi
