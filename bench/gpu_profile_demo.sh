#!/usr/bin/env bash
# --profile under a profiler on the GPU machine (repository root; after scripts/device_prep.sh as
# for bench/gpu_bench.sh): a short bf16 Llama run with --profile --profile-step-start 3
# --profile-step-end 5, so cudaProfilerStart/Stop bracket iterations 4 and 5. Prints which
# iterations the capture holds (the trainer's "iteration N" NVTX ranges and its log lines) and the
# NVTX range names seen in it (per layer, "layer L forward/backward"; per pipeline action), then
# one JSON line. Uses Nsight Systems where `nsys` exists (--capture-range=cudaProfilerApi, as with
# Megatron-LM), else Nsight Compute (--profile-from-start off honours cudaProfilerStart/Stop; one
# cheap metric per kernel keeps its kernel replay to about a minute). Logs go to $OUT.
#   MT_BIN=<megatron>  use that binary instead of building one in $MT_DEVICE_BUILD (/tmp/mt_build)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
M=${MT_BIN:-$B/bin/megatron}
if [ ! -x "$M" ]; then
  t0=$(date +%s)
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 || { echo "configure failed"; grep -A8 "CMake Error" "$OUT/configure.txt" | head -40; exit 1; }
  cmake --build "$B" -j"$(nproc)" --target megatron >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -30; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
START=3 END=5 ITERS=7
# 2 layers, 2 micro-batches per step: every range name appears, and the capture stays small.
RUN=(pretrain --num-layers 2 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 4
     --seq-length 256 --max-position-embeddings 256 --normalization RMSNorm --swiglu --position-embedding-type rope
     --disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0
     --mock-data --vocab-size 1024 --micro-batch-size 2 --global-batch-size 4 --train-iters $ITERS --lr 1e-4
     --log-interval 1 --eval-iters 0 --no-progress-bar --bf16 --device cuda --data-cache-path /tmp/mt_cache
     --profile --profile-step-start $START --profile-step-end $END)

NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
t0=$(date +%s)
if [ -n "$NSYS" ]; then
  TOOL=nsys
  timeout 300 "$NSYS" profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda,nvtx \
    -o "$OUT/profile" --force-overwrite true "$M" "${RUN[@]}" >"$OUT/profile_run.txt" 2>&1
  rc=$?
  # The NVTX summary's report is nvtx_sum (nvtxsum before 2023): try both.
  { "$NSYS" stats --report nvtx_sum --format csv "$OUT/profile.nsys-rep" ||
    "$NSYS" stats --report nvtxsum --format csv "$OUT/profile.nsys-rep"; } >"$OUT/profile_nvtx.txt" 2>&1
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv "$OUT/profile.nsys-rep" >"$OUT/profile_kernels.txt" 2>&1
  KERNELS=$(awk -F, 'NR > 1 && $3 ~ /^"?[0-9]+"?$/ { gsub(/"/, "", $3); n += $3 } END { print n + 0 }' "$OUT/profile_kernels.txt")
elif [ -n "$NCU" ]; then
  TOOL=ncu
  # Kernels only between cudaProfilerStart/Stop; NVTX kept so each kernel carries its ranges;
  # one metric (duration); a launch cap that a 2-step capture of this model stays far below.
  timeout 300 "$NCU" --profile-from-start off --nvtx --metrics gpu__time_duration.sum --launch-count 5000 \
    -o "$OUT/profile" -f "$M" "${RUN[@]}" >"$OUT/profile_run.txt" 2>&1
  rc=$?
  # The ranges: ncu's per-NVTX summary, and each kernel's NVTX push/pop stack on the details page.
  { "$NCU" --import "$OUT/profile.ncu-rep" --print-summary per-nvtx
    "$NCU" --import "$OUT/profile.ncu-rep" --page details; } >"$OUT/profile_nvtx.txt" 2>&1
  "$NCU" --import "$OUT/profile.ncu-rep" --print-summary per-kernel >"$OUT/profile_kernels.txt" 2>&1
  KERNELS=$("$NCU" --import "$OUT/profile.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum 2>/dev/null |
            tail -n +3 | grep -c . || true)
else
  echo "neither nsys nor ncu found"; exit 1
fi
echo "$TOOL run: exit $rc, $(( $(date +%s) - t0 )) s (output in $OUT/profile_run.txt)"
grep -E -- "--profile: CUDA profiler (started|stopped)" "$OUT/profile_run.txt"
grep -E "^ iteration +[0-9]+/" "$OUT/profile_run.txt" | sed -E 's/\|.*elapsed time per iteration \(ms\): ([0-9.]+).*/| \1 ms/'

# What the capture holds: the iteration ranges (exactly $((START + 1))..$END wanted) and the
# other range names, with how often each appears in the tool's NVTX summary.
ITERS_SEEN=$(grep -oE "iteration [0-9]+" "$OUT/profile_nvtx.txt" | sort -u -k2n | awk '{print $2}' | paste -sd, -)
WANT=$(seq $((START + 1)) $END | paste -sd, -)
echo "captured iterations (NVTX): ${ITERS_SEEN:-none} (requested $WANT: $([ "$ITERS_SEEN" = "$WANT" ] && echo PASS || echo FAIL))"
echo "NVTX range names seen (occurrences in $OUT/profile_nvtx.txt):"
grep -oE "layer [0-9]+ (forward|backward)|(forward|backward) chunk [0-9]+ micro-batch [0-9]+" "$OUT/profile_nvtx.txt" |
  sort | uniq -c | sed 's/^/  /'
LAYERS=$(grep -oE "layer [0-9]+ (forward|backward)" "$OUT/profile_nvtx.txt" | sort -u | wc -l)
printf '{"bench":"gpu-profile-demo","tool":"%s","requested_iterations":"%s","captured_iterations":"%s","layer_ranges":%d,"kernels":%s,"exit":%d}\n' \
  "$TOOL" "$WANT" "${ITERS_SEEN:-}" "$LAYERS" "${KERNELS:-0}" "$rc"
