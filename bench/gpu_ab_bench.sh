#!/usr/bin/env bash
# A/B of llama-1.5b on one GPU within one device call: the working tree against a git ref
# (MT_AB_BASE, default HEAD), interleaved (base, new, base, new, ...), because the lent H100s
# differ by ~2% from machine to machine and only same-call ratios mean anything (BENCHMARKS.md).
# From the repository root on the device: bash bench/gpu_ab_bench.sh [reps]. The base must be a ref
# the device copy's .git knows (it can lag commits made since: name a hash when in doubt, and
# check the printed one). Extra training flags
# for both: MT_AB_FLAGS; environment for the new build only: MT_AB_NEW_ENV (e.g. "MT_GEMM_TUNE=0").
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
REPS=${1:-2}
BASE=${MT_AB_BASE:-HEAD}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); base $BASE ($(git rev-parse --short "$BASE"))"
rm -rf /tmp/mt_ab_base && git worktree add -q -f /tmp/mt_ab_base "$BASE" || { echo "no worktree for $BASE"; exit 1; }
[ -d third_party_carry ] && ln -sfn "$PWD/third_party_carry" /tmp/mt_ab_base/third_party_carry
build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/ab_cfg_$(basename "$2").txt" 2>&1 &&
    cmake --build "$2" -j"$(nproc)" --target megatron >"$OUT/ab_build_$(basename "$2").txt" 2>&1
}
t0=$(date +%s)
build . /tmp/mt_ab_new || { echo "new build failed"; grep -E "error|FAILED" "$OUT/ab_build_mt_ab_new.txt" | head -20; exit 1; }
build /tmp/mt_ab_base /tmp/mt_ab_old || { echo "base build failed"; exit 1; }
echo "built both in $(( $(date +%s) - t0 )) s"
# shellcheck disable=SC2206
LLAMA=("${LLAMA_1_5B[@]}" --global-batch-size 32 --train-iters ${MT_BENCH_ITERS:-12}
       --mock-data --bf16 --device cuda --log-interval 1 --eval-iters 0 --no-progress-bar --lr 1e-4 --clip-grad 1.0
       --attention-dropout 0 --hidden-dropout 0 --data-cache-path /tmp/mt_cache ${MT_AB_FLAGS:-})
median() {  # tokens/s over iterations 4 onwards
  grep '^ iteration' "$1" | tail -n +4 | grep -oE 'tokens per second: [0-9]+' | awk '{print $4}' | sort -n |
    awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}
for rep in $(seq "$REPS"); do
  for v in base new; do
    log="$OUT/ab_${v}_$rep.txt"
    if [ $v = base ]; then /tmp/mt_ab_old/bin/megatron pretrain "${LLAMA[@]}" >"$log" 2>&1
    else env ${MT_AB_NEW_ENV:-} /tmp/mt_ab_new/bin/megatron pretrain "${LLAMA[@]}" >"$log" 2>&1; fi
    echo "$v rep $rep: median tokens/s $(median "$log") | $(grep '^ iteration' "$log" | tail -1 | grep -oE 'lm loss: [0-9.E+-]+') | $(grep -oE 'peak GPU memory: [0-9.]+ GiB' "$log" | tail -1)"
  done
done
git worktree remove --force /tmp/mt_ab_base 2>/dev/null
