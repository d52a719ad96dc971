#!/usr/bin/env bash
# Issue #22's decode speed in one device call: the small-row GEMV's GPU tests (against the CPU
# linear, its choice in gemm.cu, its time against cuBLASLt's at decode shapes), the engine's
# greedy tokens with the GEMV equal to cuBLASLt's, then generate_bench at batch 1 (eager, graphed
# on cuBLASLt, graphed on the GEMV: tokens/s and the fraction of the HBM bound) and batch 64.
# Builds test_kernels, test_inference and generate_bench into $B (MT_DEVICE_BUILD, default
# /tmp/mt_build) where they are missing. Prints a short summary; logs in $OUT.
#   MT_GEN_ARGS="--prompt 128 --new 256 --batch 64 --ttft-prompt 2048"   (generate_bench's)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${B:-${MT_DEVICE_BUILD:-/tmp/mt_build}}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
if [ ! -x "$B/bin/test_kernels" ] || [ ! -x "$B/bin/test_inference" ] || [ ! -x "$B/bin/generate_bench" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 &&
    cmake --build "$B" -j"$(nproc)" --target test_kernels test_inference generate_bench >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; grep -E "error|FAILED" "$OUT/build.txt" | head -20; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
t1=$(date +%s)
"$B/bin/test_kernels" --gtest_filter='GpuGemv*' >"$OUT/gemv_tests.txt" 2>&1; echo "test_kernels GpuGemv* rc=$?"
grep -E "^gemv M|OK \]|FAILED|Failure|Expected|Which is|actual" "$OUT/gemv_tests.txt" | head -60
"$B/bin/test_inference" --gtest_filter='InferenceGpu.Gemv*:InferenceGpu.CudaGraph*:InferenceGpu.Greedy*' \
  >"$OUT/engine_tests.txt" 2>&1; echo "test_inference InferenceGpu rc=$?"
grep -E "OK \]|FAILED|Failure|Expected|Which is" "$OUT/engine_tests.txt" | head -20
echo "tests in $(( $(date +%s) - t1 )) s"
# shellcheck disable=SC2086
timeout 240 "$B/bin/generate_bench" ${MT_GEN_ARGS:-} 2>"$OUT/generate_bench.err"; echo "generate_bench rc=$?"
echo "total $(( $(date +%s) - t0 )) s"
