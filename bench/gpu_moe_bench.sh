#!/usr/bin/env bash
# The moe-2b benchmark on one GPU (issue #17): megatron.cpp against the PyTorch anchor
# ../shared/bench/torch_moe.py (scripts/device_prep.sh copies it into third_party_carry/anchors/) in the same call, with the
# same gradient accumulation. Prints one JSON line per run and megatron.cpp's time breakdown
# (router, permute, expert GEMMs, unpermute). Expects the build of bench/gpu_bench.sh in
# $MT_DEVICE_BUILD (or builds it).
#   MT_MOE_ACCUM="1 8"   micro-batches per step to measure (global batch 4 x accum)
#   MT_MOE_BREAKDOWN=0   no --log-op-breakdown (its CUDA events cost ~1%: the MFU figure's run)
#   MT_MOE_IMPLS="grouped loop"   the anchor's expert implementations to run
#   MT_MOE_EXTRA="..."   extra megatron.cpp flags (e.g. --nondeterministic-attention, Megatron's default)
#   MT_SKIP_ANCHOR=1      megatron.cpp only
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/moe_2b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_BENCH_ITERS:-20}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ ! -x "$B/bin/megatron" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/configure.txt" 2>&1 &&
    cmake --build "$B" -j"$(nproc)" --target megatron >"$OUT/build.txt" 2>&1 || { echo "build failed"; exit 1; }
fi
M="$B/bin/megatron"

median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

for accum in ${MT_MOE_ACCUM:-1}; do
  gbs=$((4 * accum))
  name=moe-2b-accum$accum
  "$M" pretrain "${MOE_2B[@]}" --global-batch-size $gbs --mock-data --bf16 --device cuda --train-iters "$ITERS" \
    --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --clip-grad 1.0 --attention-dropout 0 \
    --hidden-dropout 0 ${MT_MOE_EXTRA:-} $([ "${MT_MOE_BREAKDOWN:-1}" = 0 ] || echo --log-op-breakdown) --data-cache-path /tmp/mt_cache >"$OUT/$name.txt" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name failed (rc $rc)"; tail -5 "$OUT/$name.txt"
  else
    lines=$(grep '^ iteration' "$OUT/$name.txt" | tail -n +6)
    tok=$(echo "$lines" | sed -E 's/.*tokens per second: ([0-9]+).*/\1/' | median)
    tf=$(echo "$lines" | sed -E 's/.*TFLOP\/s\/GPU\): ([0-9.]+).*/\1/' | median)
    ms=$(echo "$lines" | sed -E 's/.*iteration \(ms\): ([0-9.]+).*/\1/' | median)
    mem=$(grep -oE 'peak GPU memory: [0-9.]+' "$OUT/$name.txt" | awk '{print $4}')
    printf '{"bench":"%s","impl":"megatron.cpp","device":"%s","accum":%s,"tokens_per_s":%s,"active_tflops":%s,"mfu_active_pct":%.1f,"peak_mem_gib":%s,"step_time_median_ms":%s,"iters":%s,"commit":"%s"}\n' \
      "$name" "$GPU" "$accum" "$tok" "$tf" "$(echo "$tf" | awk '{print 100 * $1 / 989}')" "${mem:-null}" "$ms" "$ITERS" "$COMMIT"
    grep "time breakdown" "$OUT/$name.txt" | tail -1
    grep '^ iteration' "$OUT/$name.txt" | tail -1 | grep -oE 'lm loss: [^|]*\|[^|]*\|'
  fi
  if [ "${MT_SKIP_ANCHOR:-0}" != 1 ] && [ -f third_party_carry/anchors/torch_moe.py ]; then
    for impl in ${MT_MOE_IMPLS:-grouped loop}; do
      python3 third_party_carry/anchors/torch_moe.py --impl $impl --accum "$accum" 2>"$OUT/torch_$impl.err" | tail -1 ||
        { echo "torch_moe $impl failed"; tail -3 "$OUT/torch_$impl.err"; }
    done
  fi
done
