#!/usr/bin/env bash
# Bad input to the data layer (issue #27): a .npy whose shape overflows, a preprocess worker that
# runs out of memory, absurd --workers/--partitions, FIFOs/devices/directories where data files
# belong, and damaged gzip input. Each case: one clear error line, a non-zero exit, no hang, no
# temporary files left, and the data that existed before intact (checksums before and after).
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"

# expect_failure "needle" args...: for commands that print progress before they fail (preprocess):
# a non-zero exit without a timeout, one error line (the last line of stderr) holding needle.
expect_failure() {
  local needle=$1; shift
  timeout 120 "$MEGATRON" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null; local rc=$?
  local errors; errors=$(grep -c "error" "$TMP/err")
  if [ $rc -eq 0 ] || [ $rc -eq 124 ] || [ "$errors" -ne 1 ] || ! tail -n 1 "$TMP/err" | grep -qF -- "$needle"; then
    echo "FAIL: megatron $* -> rc=$rc, wanted: $needle"; head -c 2000 "$TMP/err"
    fails=$((fails+1))
  else
    passes=$((passes+1))
  fi
}

no_temporaries() { ! find "$1" -name '*.tmp*' | grep -q .; }

W=$TMP/work; mkdir -p "$W"
NULL_TOK=(--tokenizer-type NullTokenizer --vocab-size 10)
printf '{"text": "1 2 3"}\n{"text": "4 5"}\n' >"$W/small.jsonl"
"$MEGATRON" preprocess --input "$W/small.jsonl" --output-prefix "$W/ds" "${NULL_TOK[@]}" >/dev/null 2>&1 \
  || { echo "FAIL: preprocess of a valid file"; exit 1; }
"$MEGATRON" pretrain --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1 \
  --train-iters 1 --lr 1e-3 --mock-data --vocab-size 32 --eval-iters 0 --no-progress-bar \
  --save "$W/ckpt" --save-interval 1 >/dev/null 2>&1 || { echo "FAIL: tiny training run"; exit 1; }
echo "earlier output" >"$W/logits.npy"
before=$(tree_sum "$W")

# 1. A .npy shape (2^62, 4) with no data: its element count overflows (it used to wrap to 0 and
#    crash with SIGSEGV). And byte counts that overflow although the element count does not.
npy() {  # npy FILE SHAPE: a version 1.0 header of <i8 with that shape, and no data
  local h="{'descr': '<i8', 'fortran_order': False, 'shape': $2, }"
  local pad=$(( (64 - (10 + ${#h} + 1) % 64) % 64 ))
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $(( (${#h} + pad + 1) % 256 )))\\x$(printf %02x $(( (${#h} + pad + 1) / 256 )))";
    printf '%s' "$h"; printf "%${pad}s\n" ""; } >"$1"
}
npy "$TMP/big.npy" "(4611686018427387904, 4)"
expect_error "big.npy: .npy shape (4611686018427387904, 4): size 4611686018427387904 x 4 is too large" \
  logits --load "$W/ckpt" --input-ids "$TMP/big.npy" --output "$W/logits.npy"
npy "$TMP/bytes.npy" "(1152921504606846976, 2)"
expect_error "bytes.npy: .npy shape (1152921504606846976, 2): size 2305843009213693952 x 8 is too large" \
  logits --load "$W/ckpt" --input-ids "$TMP/bytes.npy" --output "$W/logits.npy"
npy "$TMP/short.npy" "(2, 3)"
expect_error "short.npy is truncated or corrupt: shape (2, 3) of <i8 needs 48 data bytes, the file has 0" \
  logits --load "$W/ckpt" --input-ids "$TMP/short.npy" --output "$W/logits.npy"

# 2. A worker that runs out of memory (a 60 MB line under a 300 MB address-space limit) used to
#    abort with std::bad_alloc and leave .tmp files; now one error, no temporaries, and the
#    earlier complete output with the same prefix is untouched. OpenBLAS gets one thread so its
#    own start-up fits the limit.
{ printf '{"text": "'; yes 1 | head -c 60000000 | tr '\n' ' '; printf '"}\n'; } >"$TMP/long.jsonl"
# The limit is 300 MB on top of the shared libraries' file sizes: a CUDA build maps cuBLASLt &c.
# (hundreds of MB) at start-up, which a fixed limit would refuse before main() runs.
LIBS_KB=$(ldd "$MEGATRON" | awk '/=> \// {print $3}' | xargs -r stat -Lc %s | awk '{s += $1} END {print int(s / 1024)}')
(ulimit -v $((300000 + LIBS_KB)); export OPENBLAS_NUM_THREADS=1; expect_failure "ran out of memory" \
  preprocess --input "$TMP/long.jsonl" --output-prefix "$W/ds" "${NULL_TOK[@]}" --workers 1; exit $fails)
[ $? -eq 0 ] && passes=$((passes+1)) || fails=$((fails+1))
rm -f "$TMP/long.jsonl"
check "no temporary files after the out-of-memory failure" no_temporaries "$W"

# 3. Worker and partition counts: parsed as 64-bit values and bounded (they used to be narrowed:
#    99999999999 became 1215752191 threads; 10000 workers ran for minutes at gigabytes).
P=(preprocess --input "$W/small.jsonl" --output-prefix "$W/ds" "${NULL_TOK[@]}")
expect_error "--workers 10000 is more than 4 per hardware thread" "${P[@]}" --workers 10000
expect_error "--workers 99999999999 is more than 4 per hardware thread" "${P[@]}" --workers 99999999999
expect_error "--workers 99999999999999999999 is out of range" "${P[@]}" --workers 99999999999999999999
expect_error "--partitions 99999999999 is above the limit of 256" "${P[@]}" --partitions 99999999999
expect_error "--partitions expects an integer >= 1 (got '0')" "${P[@]}" --partitions 0

# 4. FIFOs, devices and directories where a data file belongs: refused at once (a FIFO used to
#    hang the reader forever).
mkdir -p "$TMP/fifo" "$TMP/dev" "$TMP/dir"
for d in fifo dev dir; do cp "$W/ds_text_document.idx" "$TMP/$d/d.idx"; done
mkfifo "$TMP/fifo/d.bin"
ln -s /dev/zero "$TMP/dev/d.bin"
mkdir "$TMP/dir/d.bin"
TRAIN=(pretrain --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 4 --micro-batch-size 1
       --train-iters 1 --lr 1e-3 --eval-iters 0 --no-progress-bar "${NULL_TOK[@]}" --data-cache-path "$TMP/cache")
expect_error "dataset $TMP/fifo/d: '$TMP/fifo/d.bin' is not a regular file (a FIFO, socket or device)" \
  "${TRAIN[@]}" --data-path "$TMP/fifo/d"
expect_error "dataset $TMP/dev/d: '$TMP/dev/d.bin' is not a regular file" "${TRAIN[@]}" --data-path "$TMP/dev/d"
expect_error "dataset $TMP/dir/d: '$TMP/dir/d.bin' is a directory" "${TRAIN[@]}" --data-path "$TMP/dir/d"
expect_error "--merge $TMP/fifo/d: '$TMP/fifo/d.bin' is not a regular file" \
  preprocess --merge "$TMP/fifo/d" --output-prefix "$W/merged"
mkfifo "$TMP/pipe"
expect_error "--input: '$TMP/pipe' is not a regular file" preprocess --input "$TMP/pipe" --output-prefix "$W/ds" "${NULL_TOK[@]}"
expect_error "--tokenizer-model: '$TMP/pipe' is not a regular file" \
  preprocess --input "$W/small.jsonl" --output-prefix "$W/ds" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TMP/pipe"
expect_error "--vocab-file: '$TMP/pipe' is not a regular file" \
  preprocess --input "$W/small.jsonl" --output-prefix "$W/ds" --tokenizer-type GPT2BPETokenizer --vocab-file "$TMP/pipe" --merge-file "$TMP/pipe"
expect_error "--tokenizer-model: '$TMP/pipe' is not a regular file" \
  preprocess --input "$W/small.jsonl" --output-prefix "$W/ds" --tokenizer-type SentencePieceTokenizer --tokenizer-model "$TMP/pipe"
expect_error "'$TMP/pipe' is not a regular file" logits --load "$W/ckpt" --input-ids "$TMP/pipe" --output "$W/logits.npy"

# 5. Damaged gzip input names the file and the line where the damage starts (it used to say
#    "after line 0" whatever the line). A cut in the middle: the line after the last one gzip
#    itself can decompress. Two members, the second cut after its header: exactly line 1001.
awk 'BEGIN { srand(7); for (i = 0; i < 20000; i++) { s = ""; for (j = 0; j < 20; j++) s = s int(rand() * 10) " ";
             print "{\"text\": \"" s "\"}" } }' | gzip -c >"$TMP/full.gz"
head -c 100000 "$TMP/full.gz" >"$TMP/cut.jsonl.gz"
line=$(( $(gzip -dc "$TMP/cut.jsonl.gz" 2>/dev/null | wc -l) + 1 ))
check "the cut is inside the file" test "$line" -gt 1000 -a "$line" -lt 20000
expect_failure "cut.jsonl.gz: corrupt or truncated gzip data at line $line (unexpected end of file" \
  preprocess --input "$TMP/cut.jsonl.gz" --output-prefix "$W/ds" "${NULL_TOK[@]}"
{ for i in $(seq 1000); do echo '{"text": "1 2"}'; done | gzip -c; echo '{"text": "3"}' | gzip -c | head -c 10; } >"$TMP/two.jsonl.gz"
expect_failure "two.jsonl.gz: corrupt or truncated gzip data at line 1001 (unexpected end of file" \
  preprocess --input "$TMP/two.jsonl.gz" --output-prefix "$W/ds" "${NULL_TOK[@]}"
check "no temporary files after the gzip failures" no_temporaries "$W"

check "earlier outputs intact" [ "$(tree_sum "$W")" = "$before" ]
finish
