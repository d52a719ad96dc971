#!/usr/bin/env bash
# `megatron generate` through the engine (issue #22): --prompts-file JSONL in and out, --iteration,
# --device, --stop, and every bad input refused in one line naming the flag or the file and line;
# the checkpoint is intact after the failing commands.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 24 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear)
"$MEGATRON" pretrain "${BASE[@]}" --tokenizer-type NullTokenizer --save "$TMP/ck" --save-interval 1 \
  >"$TMP/train.log" 2>&1 || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")
G=(generate --load "$TMP/ck" --device cpu)

# JSONL in, JSONL out, in input order; per-line overrides; the same prompt gives the same tokens
# whether it runs alone or beside others (the engine batches them).
cat >"$TMP/p.jsonl" <<'J'
{"prompt": "1 2 3 4 5", "max_new_tokens": 4, "temperature": 0}

{"prompt": "7 8 9", "max_new_tokens": 6, "temperature": 0.8, "seed": 5}
{"prompt": "1 2 3 4 5", "max_new_tokens": 4, "temperature": 0}
J
"$MEGATRON" "${G[@]}" --prompts-file "$TMP/p.jsonl" --output "$TMP/out.jsonl" >"$TMP/gen.log" 2>&1
check "generate --prompts-file ran: $(tail -3 "$TMP/gen.log")" test -s "$TMP/out.jsonl"
check "one result per prompt" test "$(wc -l <"$TMP/out.jsonl")" -eq 3
check "results in input order" bash -c "head -1 '$TMP/out.jsonl' | grep -q '\"index\":0' && tail -1 '$TMP/out.jsonl' | grep -q '\"index\":2'"
check "results carry tokens, text and finish reason" \
  bash -c "grep -q '\"finish_reason\":\"length\"' '$TMP/out.jsonl' && grep -q '\"tokens\":\\[' '$TMP/out.jsonl'"
tok() { sed -n "$1p" "$TMP/out.jsonl" | grep -oE '"tokens":\[[0-9,]*\]'; }
check "the same prompt gives the same tokens in a batch" test "$(tok 1)" = "$(tok 3)"
check "max_new_tokens per line" bash -c "sed -n 2p '$TMP/out.jsonl' | grep -qE '\"tokens\":\\[[0-9]+(,[0-9]+){5}\\]'"
"$MEGATRON" "${G[@]}" --prompt "1 2 3 4 5" --max-new-tokens 4 --temperature 0 >"$TMP/single.txt" 2>/dev/null
"$MEGATRON" "${G[@]}" --prompt "1 2 3 4 5" --max-new-tokens 4 --temperature 0 --max-batch 1 --iteration 1 \
  >"$TMP/single1.txt" 2>/dev/null
check "--iteration 1 loads the first checkpoint: $(cat "$TMP/single1.txt")" grep -qE '^1 2 3 4 5( [0-9]+){1,4}$' "$TMP/single1.txt"
"$MEGATRON" "${G[@]}" --prompts-file "$TMP/p.jsonl" --stop " " >"$TMP/stop.jsonl" 2>/dev/null
check "--stop ends at the stop string" bash -c "grep -c '\"finish_reason\":\"stop\"' '$TMP/stop.jsonl' | grep -qx 3"

# Bad input.
expect_error "--prompt and --prompts-file are alternatives" "${G[@]}" --prompt hi --prompts-file "$TMP/p.jsonl"
expect_error "--output goes with --prompts-file" "${G[@]}" --prompt hi --output "$TMP/x.jsonl"
expect_error "--prompts-file: cannot open '$TMP/none.jsonl'" "${G[@]}" --prompts-file "$TMP/none.jsonl"
expect_error "--prompts-file: '$TMP' is a directory" "${G[@]}" --prompts-file "$TMP"
printf '\n\n' >"$TMP/empty.jsonl"
expect_error "--prompts-file '$TMP/empty.jsonl' holds no prompts" "${G[@]}" --prompts-file "$TMP/empty.jsonl"
printf '{"prompt": "1"}\n{"prompt": "1"\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:2: not valid JSON" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '[1, 2]\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: each line must be a JSON object" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"text": "1"}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: unknown field \"text\"" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"max_new_tokens": 3}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: no \"prompt\" field" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "1", "max_new_tokens": -2}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: \"max_new_tokens\" must be >= 0 (got -2)" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "1", "temperature": "hot"}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: \"temperature\" must be a number" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "1", "top_p": 0}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl prompt 1: top-p must be in (0, 1] (got 0)" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "1", "stop": [1]}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl:1: \"stop\" must be a string or a list of strings" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "1 2 3", "max_new_tokens": 30}\n' >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl prompt 1 (3 tokens) + --max-new-tokens (30) exceeds the model's context of 24 tokens" \
  "${G[@]}" --prompts-file "$TMP/bad.jsonl"
printf '{"prompt": "%s"}\n' "$(seq -s ' ' 1 25)" >"$TMP/bad.jsonl"
expect_error "$TMP/bad.jsonl prompt 1 is 25 tokens but the model's context is 24" "${G[@]}" --prompts-file "$TMP/bad.jsonl"
expect_error "--iteration 7: '$TMP/ck' holds no such iteration" "${G[@]}" --prompt hi --iteration 7
expect_error "--device got 'tpu'" "${G[@]}" --prompt hi --device tpu
expect_error "--max-batch: value out of range" "${G[@]}" --prompt hi --max-batch 0
expect_error "--load: directory '$TMP/nothing' does not exist" generate --load "$TMP/nothing" --prompt hi

check "the checkpoint is intact after the failing commands" test "$before" = "$(tree_sum "$TMP/ck")"
finish
