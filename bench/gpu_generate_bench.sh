#!/usr/bin/env bash
# The generation engine on one GPU (issue #22): megatron.cpp's engine (bench/generate_bench.cpp)
# and HF transformers' generate() (bench/hf_generate_anchor.py) on the llama-1.5b shape with
# random bf16 weights, in the same call. Prints JSON lines:
#   copy_bandwidth  measured device-to-device copy rate (read + write bytes/s)
#   decode_batch1   tokens/s at batch 1 and fraction_of_bound: the HBM bound is (weight bytes +
#                   KV cache bytes read per token) / the measured copy rate (target >= 0.70);
#                   graphed lines add graph_gpu_ms_per_token (the graph replayed back to back:
#                   GPU time alone), host_gap_ms_per_token and gpu_fraction_of_bound; the graphed
#                   GEMV run six times, "path": "default" (the decode kernels, their fusions,
#                   the Wide GEMV), "general" (MT_DECODE_FUSED=0), "default-fusions"
#                   (MT_DECODE_FUSIONS=0), "default+gemv-base" (MT_GEMV_KERNEL=base) and
#                   "default-arena" (the graph's temporaries as the pool's memory nodes,
#                   MT_DECODE_ARENA=0), "default+stack" (the opt-in whole-stack kernel,
#                   one kernel for every layer, MT_DECODE_STACK=1), each variant with "same_tokens" (its greedy ids equal the
#                   default run's)
#   decode_batch64  generated tokens/s with 64 requests at once
#   ttft_2048       ms to the first token of a 2,048-token prompt
# Builds generate_bench into $MT_DEVICE_BUILD (default /tmp/mt_build) where it is missing.
#   MT_GEN_ARGS="--prompt 128 --new 256 --batch 64 --ttft-prompt 2048"   (passed to both)
#   MT_HF_ARGS="--cache static"   (the anchor only: a static cache, compiled first)
#   MT_GEN_FP8=1   also the engine with FP8 weights (generate_bench --fp8 1), its lines "fp8": true
#   MT_GEN_HF=0    skip the transformers anchor
#   MT_DECODE_GRAPH_STATS=1   log each decode graph's node census at capture (generate_bench.err)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ARGS=${MT_GEN_ARGS:-}
if [ ! -x "$B/generate_bench" ] && [ ! -x "$B/bin/generate_bench" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_BUILD_TESTS=OFF \
    >"$OUT/configure.txt" 2>&1 &&
    cmake --build "$B" -j"$(nproc)" --target generate_bench >"$OUT/build.txt" 2>&1 ||
    { echo "build failed"; tail -20 "$OUT/build.txt"; exit 1; }
fi
GB="$B/generate_bench"; [ -x "$GB" ] || GB="$B/bin/generate_bench"
# shellcheck disable=SC2086
"$GB" $ARGS 2>"$OUT/generate_bench.err" || { echo "generate_bench failed"; tail -5 "$OUT/generate_bench.err"; }
if [ "${MT_GEN_FP8:-0}" = 1 ]; then
  # shellcheck disable=SC2086
  "$GB" $ARGS --fp8 1 2>"$OUT/generate_bench_fp8.err" ||
    { echo "generate_bench --fp8 1 failed"; tail -5 "$OUT/generate_bench_fp8.err"; }
  grep -h "FP8 weights" "$OUT/generate_bench_fp8.err"
fi
[ "${MT_GEN_HF:-1}" = 0 ] && exit 0
# The anchor takes the shape flags only: generate_bench's own (--graphs-only, --fp8) are dropped
# (session 18's call 7 lost its HF figures to "unrecognized arguments: --graphs-only 1").
HF_ARGS=$(echo "$ARGS" | sed -E 's/--(graphs-only|fp8)[ =]+[0-9]+//g')
# shellcheck disable=SC2086
python3 bench/hf_generate_anchor.py $HF_ARGS ${MT_HF_ARGS:-} 2>"$OUT/hf_generate.err" ||
  { echo "hf anchor failed"; tail -5 "$OUT/hf_generate.err"; }
