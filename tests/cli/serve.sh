#!/usr/bin/env bash
# `megatron serve` end to end on a tiny CPU checkpoint: starts it on a free port (with a third
# argument `engine`: through the generation engine, as on the GPU; serve_engine.sh), sends
# concurrent requests to both endpoints (one streaming) and bad ones (malformed JSON, wrong
# types, an oversized prompt, too many tokens, a body over the cap), checks every answer
# (greedy and seeded answers equal `megatron generate`'s), then stops it with SIGTERM and
# checks a clean exit. Every wait has a timeout.
set -u
MEGATRON=$1
source "$2/tests/cli/lib/expect.bash"
MODE=${3:-cpu}
SERVE_FLAGS=()
[ "$MODE" = engine ] && SERVE_FLAGS=(--engine)
SERVER=""
trap '[ -n "$SERVER" ] && kill -KILL "$SERVER" 2>/dev/null; rm -rf "$TMP"' EXIT

"$MEGATRON" pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
  --max-position-embeddings 32 --position-embedding-type rope --normalization RMSNorm --swiglu \
  --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --mock-data --vocab-size 100 --train-iters 3 \
  --eval-iters 0 --seed 5 --no-progress-bar --data-cache-path "$TMP/cache" --save "$TMP/ckpt" \
  >"$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; exit 1; }

"$MEGATRON" serve --load "$TMP/ckpt" --port 0 --max-prompt-tokens 16 --max-tokens-to-generate 24 \
  --max-body-bytes 4096 --max-concurrent-requests 8 --num-threads 1 "${SERVE_FLAGS[@]}" >"$TMP/serve.out" \
  2>"$TMP/serve.err" &
SERVER=$!
for _ in $(seq 1 600); do  # at most 60 s to load and listen
  grep -q "listening on" "$TMP/serve.out" 2>/dev/null && break
  kill -0 "$SERVER" 2>/dev/null || break
  sleep 0.1
done
PORT=$(sed -nE 's|.*listening on http://127\.0\.0\.1:([0-9]+).*|\1|p' "$TMP/serve.out")
[ -n "$PORT" ] || { echo "FAIL: the server did not start"; cat "$TMP/serve.out" "$TMP/serve.err"; exit 1; }
URL="http://127.0.0.1:$PORT"

expect_error "--port $PORT: cannot listen on 127.0.0.1:$PORT (in use" serve --load "$TMP/ckpt" --port "$PORT"

# req NAME METHOD PATH BODY: the answer's body in $TMP/NAME.json, its status in $TMP/NAME.code.
req() {
  printf '%s' "$4" >"$TMP/$1.req"
  curl -s -m 60 -o "$TMP/$1.json" -w '%{http_code}' -X "$2" -H 'Content-Type: application/json' \
    --data-binary @"$TMP/$1.req" "$URL$3" >"$TMP/$1.code" 2>"$TMP/$1.curl"
}
status_is() { [ "$(cat "$TMP/$1.code")" = "$2" ] || { echo "$1: status $(cat "$TMP/$1.code"): $(head -c 500 "$TMP/$1.json")"; false; }; }
# json NAME EXPR: a Python expression over the answer `j`, printed.
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$TMP/$1.json"; }

"$MEGATRON" generate --load "$TMP/ckpt" --prompt "1 2 3" --max-new-tokens 6 --temperature 0 >"$TMP/greedy.txt" 2>/dev/null
"$MEGATRON" generate --load "$TMP/ckpt" --prompt "4 5" --max-new-tokens 6 --seed 11 >"$TMP/sampled.txt" 2>/dev/null
GREEDY=$(cat "$TMP/greedy.txt"); SAMPLED=$(cat "$TMP/sampled.txt")
check "generate gave a greedy reference" [ -n "$GREEDY" ]

# Concurrent: three of each endpoint at once, and one stream (curl's -m bounds each).
pids=()
for i in 1 2 3; do
  req api$i PUT /api '{"prompts": ["1 2 3"], "tokens_to_generate": 6, "top_k": 1}' & pids+=($!)
  req oai$i POST /v1/completions '{"prompt": "1 2 3", "max_tokens": 6, "temperature": 0, "model": "x"}' & pids+=($!)
done
curl -s -N -m 60 -X POST -H 'Content-Type: application/json' \
  -d '{"prompt": "1 2 3", "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' \
  "$URL/v1/completions" >"$TMP/stream.txt" 2>/dev/null & pids+=($!)
req seeded PUT /api '{"prompts": ["4 5"], "tokens_to_generate": 6, "random_seed": 11, "temperature": 1.0}' & pids+=($!)
wait "${pids[@]}"
for i in 1 2 3; do
  check "PUT /api #$i answered 200" status_is api$i 200
  check "PUT /api #$i greedy text equals generate's" [ "$(json api$i 'j["text"][0]')" = "$GREEDY" ]
  check "PUT /api #$i has tokens and segments" \
    [ "$(json api$i 'len(j["tokens"][0]) == len(j["segments"][0]) == 9')" = True ]
  check "POST /v1/completions #$i answered 200" status_is oai$i 200
  check "POST /v1/completions #$i greedy text equals generate's" [ "1 2 3$(json oai$i 'j["choices"][0]["text"]')" = "$GREEDY" ]
  check "POST /v1/completions #$i shape" [ "$(json oai$i '(j["object"], j["choices"][0]["finish_reason"], j["usage"]["total_tokens"])')" = "('text_completion', 'length', 9)" ]
done
check "seeded sampling equals generate --seed" [ "$(json seeded 'j["text"][0]')" = "$SAMPLED" ]
STREAMED=$(python3 -c '
import json, sys
text, fin, usage, done = "", None, None, False
for line in open(sys.argv[1]):
    if not line.startswith("data: "): continue
    d = line[6:].strip()
    if d == "[DONE]": done = True; continue
    c = json.loads(d)
    if c.get("usage"): usage = c["usage"]["completion_tokens"]
    for ch in c["choices"]:
        text += ch["text"]; fin = ch["finish_reason"] or fin
print(repr((text, fin, usage, done)))' "$TMP/stream.txt")
check "the stream joins to the greedy text, ends with [DONE]" [ "$STREAMED" = "$(python3 -c 'import sys; print(repr((sys.argv[1][len("1 2 3"):], "length", 6, True)))' "$GREEDY")" ]

# A stop string ends the text before it: the greedy continuation's third token as the stop.
CONT=${GREEDY#1 2 3}
STOP=" $(echo "$CONT" | awk '{print $3}')"
req stop POST /v1/completions "{\"prompt\": \"1 2 3\", \"max_tokens\": 6, \"temperature\": 0, \"stop\": \"$STOP\"}"
check "stop string: finish_reason stop, text cut before it" \
  [ "$(json stop 'j["choices"][0]["finish_reason"] + "|" + j["choices"][0]["text"]')" = "stop|${CONT%%"$STOP"*}" ]

# Bad requests: 4xx with a JSON message, and the server lives on.
bad() {  # bad NAME STATUS NEEDLE METHOD PATH BODY
  req "$1" "$4" "$5" "$6"
  check "$1: $2" status_is "$1" "$2"
  check "$1: message names it" grep -qF -- "$3" "$TMP/$1.json"
}
bad malformed 400 "not valid JSON" PUT /api '{"prompts": ["1 2"'
bad not_object 400 "must be a JSON object" POST /v1/completions '[1, 2]'
bad wrong_type 400 '\"tokens_to_generate\" must be an integer' PUT /api '{"prompts": ["1"], "tokens_to_generate": "5"}'
bad no_prompts 400 '\"prompts\" is required' PUT /api '{"tokens_to_generate": 5}'
bad unknown_field 400 'unknown field \"max_new\"' POST /v1/completions '{"prompt": "1", "max_new": 5}'
bad retired_field 400 "replace it with tokens_to_generate" PUT /api '{"prompts": ["1"], "max_len": 5}'
bad too_many_tokens 400 "--max-tokens-to-generate" POST /v1/completions '{"prompt": "1 2", "max_tokens": 25}'
bad beyond_context 400 "exceed the model's context of 32 tokens: ask for 22 or fewer" POST /v1/completions \
  "{\"prompt\": \"$(seq -s ' ' 1 10)\", \"max_tokens\": 23}"
bad huge_count 400 "--max-tokens-to-generate" PUT /api '{"prompts": ["1"], "tokens_to_generate": 18446744073709551615}'
bad oversized_prompt 400 "--max-prompt-tokens" POST /v1/completions "{\"prompt\": \"$(seq -s ' ' 1 20)\", \"max_tokens\": 1}"
bad bad_token_id 400 "prompt token id" POST /v1/completions '{"prompt": [1, 2, 1000], "max_tokens": 1}'
bad untokenizable 400 "cannot be tokenized" PUT /api '{"prompts": ["hello"]}'
bad deep 400 "nests deeper" PUT /api "$(printf '[%.0s' $(seq 1 2000))"
bad body_too_big 413 "--max-body-bytes" PUT /api "{\"prompts\": [\"$(seq -s ' ' 1 2000)\"]}"
bad no_route 404 "PUT /api" GET /nothing ''
bad temperature 400 '\"temperature\" must be in (0, 100]' PUT /api '{"prompts": ["1"], "temperature": 0}'
bad n_two 400 '\"n\" must be 1' POST /v1/completions '{"prompt": "1", "n": 2}'
check "GET /health after the bad requests" bash -c "curl -sf -m 10 '$URL/health' | grep -q ok"
req after PUT /api '{"prompts": ["1 2 3"], "tokens_to_generate": 6, "top_k": 1}'
check "still answers after the bad requests" [ "$(json after 'j["text"][0]')" = "$GREEDY" ]
check "GET /v1/models names the model" bash -c "curl -sf -m 10 '$URL/v1/models' | grep -q '\"id\":\"ckpt\"'"

# Logprobs (Megatron's): the prompt's (one per token after the first), then the generated ones'
# (the engine's equal the CPU backend's: serve_tp.sh).
req logprobs PUT /api '{"prompts": ["1 2 3"], "tokens_to_generate": 2, "top_k": 1, "logprobs": true}'
check "logprobs: 2 for the prompt + 2 generated, all <= 0" \
  [ "$(json logprobs 'len(j["logprobs"][0]) == 4 and all(x <= 0 for x in j["logprobs"][0])')" = True ]
req score PUT /api '{"prompts": ["1 2 3"], "tokens_to_generate": 0, "logprobs": true}'
check "tokens_to_generate 0 scores the prompt" [ "$(json score '(j["text"][0], len(j["logprobs"][0]))')" = "('1 2 3', 2)" ]
req echo POST /v1/completions '{"prompt": "1 2 3", "max_tokens": 6, "temperature": 0, "echo": true}'
check "echo: the prompt before the completion" [ "$(json echo 'j["choices"][0]["text"]')" = "$GREEDY" ]

# SIGTERM while a long stream is in flight: the stream still completes, the exit is clean.
curl -s -N -m 60 -X POST -H 'Content-Type: application/json' \
  -d '{"prompt": "1 2 3", "max_tokens": 24, "temperature": 0, "stream": true}' \
  "$URL/v1/completions" >"$TMP/drain.txt" 2>/dev/null & STREAM=$!
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/drain.txt" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$SERVER"
for _ in $(seq 1 300); do kill -0 "$STREAM" 2>/dev/null || break; sleep 0.1; done
check "the stream in flight at SIGTERM finished" grep -q '"finish_reason":"length"' "$TMP/drain.txt"
check "the stream in flight at SIGTERM ended with [DONE]" grep -q '^data: \[DONE\]' "$TMP/drain.txt"
for _ in $(seq 1 300); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SERVER" 2>/dev/null; then
  echo "FAIL: the server still runs 30 s after SIGTERM"; fails=$((fails+1))
else
  wait "$SERVER"; rc=$?; SERVER=""
  check "SIGTERM: exit status 0 (got $rc)" [ "$rc" = 0 ]
  check "SIGTERM: the server says it stopped" grep -q "megatron serve: stopped" "$TMP/serve.err"
fi
[ $fails -eq 0 ] || { echo "--- server stderr"; tail -n 40 "$TMP/serve.err"; }
finish
