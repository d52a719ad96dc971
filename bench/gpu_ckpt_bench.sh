#!/usr/bin/env bash
# GPU checkpoints, on the GPU machine (after bench/gpu_bench.sh built $B): a tiny model saved at
# iteration 5 and resumed must continue with bit-identical losses; then save/load time of
# llama-1.5b (weights + fp32 optimizer state) with and without --async-save, and the step stall.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/llama_1_5b.sh
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
M="$B/bin/megatron"
CK=${MT_CKPT_DIR:-/tmp/mt_ckpt}
TINY=(--num-layers 2 --hidden-size 128 --num-attention-heads 4 --group-query-attention --num-query-groups 2
      --seq-length 128 --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --mock-data --vocab-size 1000 --micro-batch-size 4 --global-batch-size 8
      --train-iters 10 --lr 1e-3 --log-interval 1 --eval-iters 0 --no-progress-bar --seed 7 --bf16 --device cuda
      --data-cache-path /tmp/mt_cache)
rm -rf "$CK"
"$M" pretrain "${TINY[@]}" >"$OUT/full.txt" 2>&1
"$M" pretrain "${TINY[@]}" --save "$CK/tiny" --save-interval 5 --exit-interval 5 >"$OUT/part1.txt" 2>&1
"$M" pretrain "${TINY[@]}" --load "$CK/tiny" >"$OUT/part2.txt" 2>&1
l() { grep -oE 'iteration +[0-9]+/.*lm loss: [0-9.E+-]+' "$1" | sed -E 's/^ *iteration +([0-9]+)\/.*lm loss: /\1 /'; }
if [ -n "$(l "$OUT/part2.txt")" ] && diff <(l "$OUT/full.txt" | awk '$1 > 5') <(l "$OUT/part2.txt") >/dev/null; then
  echo "GPU save at 5 + resume: losses 6-10 bit-identical to the uninterrupted run: PASS"
else
  echo "GPU resume: FAIL"; tail -3 "$OUT/part2.txt"
fi
LLAMA=("${LLAMA_1_5B[@]}" --global-batch-size 4 --mock-data --bf16 --device cuda --log-interval 1 --eval-iters 0
       --no-progress-bar --lr 1e-4 --data-cache-path /tmp/mt_cache)
for mode in sync async; do
  extra=(); [ $mode = async ] && extra=(--async-save)
  rm -rf "$CK/llama"
  "$M" pretrain "${LLAMA[@]}" --train-iters 6 --save "$CK/llama" --save-interval 4 "${extra[@]}" >"$OUT/llama_$mode.txt" 2>&1
  echo "llama-1.5b $mode save: $(grep 'saved checkpoint' "$OUT/llama_$mode.txt" | head -1)"
  grep '^ iteration' "$OUT/llama_$mode.txt" | sed -E 's/ iteration +([0-9]+)\/.*iteration \(ms\): ([0-9.]+).*/  step \1: \2 ms/'
  du -sh "$CK/llama/iter_0000004" 2>/dev/null
done
"$M" pretrain "${LLAMA[@]}" --train-iters 7 --load "$CK/llama" >"$OUT/llama_load.txt" 2>&1
echo "llama-1.5b load: $(grep 'loaded checkpoint' "$OUT/llama_load.txt")"
tail -2 "$OUT/llama_load.txt"
