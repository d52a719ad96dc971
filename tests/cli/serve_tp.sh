#!/usr/bin/env bash
# `megatron launch --nproc-per-node 2 -- serve --tensor-model-parallel-size 2` on the CPU (#22):
# rank 0 serves HTTP and broadcasts each step's work, both ranks step their engines. The same
# concurrent requests (Megatron's PUT /api and OpenAI's /v1/completions, greedy and seeded, two
# streams) get byte-identical answers from it and from one rank's engine (OpenAI's "id" and
# "created" aside), and logprobs equal the CPU backend's (without --engine) within 1e-4 from both.
# SIGTERM drains every rank (a stream in flight finishes, exit 0); a rank killed takes the job
# down within seconds rather than hanging it; without launch, one clear error. Waits are bounded.
set -u
MEGATRON=$1
source "$2/tests/cli/lib/expect.bash"
export OMP_NUM_THREADS=1 MASTER_PORT=29587
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT

"$MEGATRON" pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 \
  --max-position-embeddings 32 --position-embedding-type rope --normalization RMSNorm --swiglu \
  --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --mock-data --vocab-size 100 --train-iters 3 \
  --eval-iters 0 --seed 5 --no-progress-bar --data-cache-path "$TMP/cache" --save "$TMP/ckpt" \
  >"$TMP/train.log" 2>&1 || { cat "$TMP/train.log"; exit 1; }
S=(serve --load "$TMP/ckpt" --port 0 --max-concurrent-requests 12 --num-threads 1)

# start NAME megatron-args...: runs it in the background (pid in PID_NAME), waits at most 60 s
# for its "listening on" line, and sets URL_NAME.
start() {
  local name=$1; shift
  "$MEGATRON" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  local pid=$!
  PIDS+=("$pid")
  eval "PID_$name=$pid"
  for _ in $(seq 1 600); do
    grep -q "listening on" "$TMP/$name.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  local port
  port=$(sed -nE 's|.*listening on http://127\.0\.0\.1:([0-9]+).*|\1|p' "$TMP/$name.out")
  [ -n "$port" ] || { echo "FAIL: $name did not start"; cat "$TMP/$name.out" "$TMP/$name.err"; exit 1; }
  eval "URL_$name=http://127.0.0.1:$port"
}
start cpu "${S[@]}"
start one "${S[@]}" --engine
start tp2 launch --nproc-per-node 2 -- "${S[@]}" --tensor-model-parallel-size 2

# ask SERVER: every request at once to one server; answers in $TMP/SERVER.NAME.
ask() {
  local url pids=()
  url=$(eval echo "\$URL_$1")
  post() {  # post NAME METHOD PATH BODY
    curl -s -N -m 60 -o "$TMP/$1.$2" -w '%{http_code}' -X "$3" -H 'Content-Type: application/json' -d "$5" \
      "$url$4" >"$TMP/$1.$2.code" 2>/dev/null
  }
  post "$1" api_greedy PUT /api '{"prompts": ["1 2 3", "7 8"], "tokens_to_generate": 8, "top_k": 1}' & pids+=($!)
  post "$1" api_seeded PUT /api '{"prompts": ["4 5"], "tokens_to_generate": 8, "random_seed": 11, "temperature": 1.0}' & pids+=($!)
  post "$1" oai_greedy POST /v1/completions '{"prompt": "1 2 3", "max_tokens": 8, "temperature": 0}' & pids+=($!)
  post "$1" oai_seeded POST /v1/completions \
    '{"prompt": ["4 5 6", "9"], "max_tokens": 8, "temperature": 0.9, "top_k": 20, "seed": 7}' & pids+=($!)
  post "$1" stream_greedy POST /v1/completions \
    '{"prompt": "2 4 6", "max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' & pids+=($!)
  post "$1" stream_seeded POST /v1/completions \
    '{"prompt": "3 1", "max_tokens": 8, "temperature": 1.1, "seed": 5, "stream": true}' & pids+=($!)
  post "$1" lp_greedy PUT /api '{"prompts": ["1 2 3 4"], "tokens_to_generate": 4, "top_k": 1, "logprobs": true}' & pids+=($!)
  post "$1" lp_seeded PUT /api \
    '{"prompts": ["5 6 7"], "tokens_to_generate": 4, "random_seed": 3, "temperature": 0.8, "logprobs": true}' & pids+=($!)
  post "$1" lp_score PUT /api '{"prompts": ["9 8 7 6"], "tokens_to_generate": 0, "logprobs": true}' & pids+=($!)
  wait "${pids[@]}"
}
ask cpu; ask one; ask tp2

# OpenAI's bodies and events without their per-response "id" and "created".
normal() {
  python3 -c '
import json, sys
def strip(j):
    if isinstance(j, dict):
        j.pop("id", None); j.pop("created", None)
    return j
text = open(sys.argv[1]).read()
if text.startswith("data: "):
    for line in text.splitlines():
        if line.startswith("data: {"): print("data: " + json.dumps(strip(json.loads(line[6:])), sort_keys=True))
        else: print(line)
else:
    print(json.dumps(strip(json.loads(text)), sort_keys=True))' "$1"
}
for n in api_greedy api_seeded oai_greedy oai_seeded stream_greedy stream_seeded lp_greedy lp_seeded lp_score; do
  check "$n: answered 200 by both" [ "$(cat "$TMP/one.$n.code") $(cat "$TMP/tp2.$n.code")" = "200 200" ]
done
for n in api_greedy api_seeded; do
  check "$n: TP 2 answers byte for byte as one rank" cmp -s "$TMP/one.$n" "$TMP/tp2.$n"
done
for n in oai_greedy oai_seeded stream_greedy stream_seeded; do
  check "$n: TP 2 answers as one rank (id, created aside)" [ "$(normal "$TMP/one.$n")" = "$(normal "$TMP/tp2.$n")" ]
done
check "the streams end with [DONE]" grep -q '^data: \[DONE\]' "$TMP/tp2.stream_greedy" "$TMP/tp2.stream_seeded"
check "the greedy answer has 8 new tokens" \
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert [len(t) for t in j["tokens"]] == [11, 10]' \
  "$TMP/tp2.api_greedy"
# Logprobs: the engine's (one rank and TP 2) against the CPU backend's: the same text and tokens,
# one logprob per token after the first, each within 1e-4.
close_logprobs() {
  python3 -c '
import json, sys
want, got = (json.load(open(f)) for f in sys.argv[1:3])
assert want["tokens"] == got["tokens"] and want["text"] == got["text"], (want, got)
for w, g, t in zip(want["logprobs"], got["logprobs"], want["tokens"]):
    assert len(w) == len(g) == len(t) - 1, (w, g, t)
    assert all(x <= 0 and abs(x - y) <= 1e-4 for x, y in zip(w, g)), (w, g)' "$1" "$2"
}
for n in lp_greedy lp_seeded lp_score; do
  check "$n: one rank's engine logprobs equal the CPU backend's" close_logprobs "$TMP/cpu.$n" "$TMP/one.$n"
  check "$n: TP 2 logprobs equal the CPU backend's" close_logprobs "$TMP/cpu.$n" "$TMP/tp2.$n"
done

# SIGTERM to the launcher while a stream is in flight: forwarded to both ranks; rank 0 drains (the
# stream completes), then tells rank 1 to stop; every rank exits 0.
curl -s -N -m 60 -X POST -H 'Content-Type: application/json' \
  -d '{"prompt": "1 2 3", "max_tokens": 24, "temperature": 0, "stream": true}' \
  "$URL_tp2/v1/completions" >"$TMP/drain.txt" 2>/dev/null & STREAM=$!
for _ in $(seq 1 300); do grep -q '^data: ' "$TMP/drain.txt" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$PID_tp2"
for _ in $(seq 1 300); do kill -0 "$STREAM" 2>/dev/null || break; sleep 0.1; done
check "the stream in flight at SIGTERM finished" grep -q '"finish_reason":"length"' "$TMP/drain.txt"
for _ in $(seq 1 600); do kill -0 "$PID_tp2" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PID_tp2" 2>/dev/null; then
  echo "FAIL: TP 2 still runs 60 s after SIGTERM"; fails=$((fails+1))
else
  wait "$PID_tp2"; rc=$?
  check "SIGTERM: every rank exits 0 (launcher status $rc)" [ "$rc" = 0 ]
  check "SIGTERM: rank 0 says it stopped" grep -q "megatron serve: stopped" "$TMP/tp2.err"
fi
kill -TERM "$PID_cpu" "$PID_one"

# A rank killed: the job ends (non-zero) within seconds, not at a timeout.
start dead launch --nproc-per-node 2 -- "${S[@]}" --tensor-model-parallel-size 2
RANK1=""
for p in $(pgrep -P "$PID_dead"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1' && RANK1=$p
done
check "found rank 1" [ -n "$RANK1" ]
[ -n "$RANK1" ] && kill -KILL "$RANK1"
for _ in $(seq 1 300); do kill -0 "$PID_dead" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$PID_dead" 2>/dev/null; then
  echo "FAIL: the job still runs 30 s after rank 1 was killed"; fails=$((fails+1))
else
  wait "$PID_dead"; rc=$?
  check "a killed rank fails the job (status $rc)" [ "$rc" != 0 ]
fi

expect_error "--tensor-model-parallel-size 2 runs as 2 ranks, but this job has 1 (start it with megatron launch" \
  serve --load "$TMP/ckpt" --tensor-model-parallel-size 2
[ $fails -eq 0 ] || { echo "--- TP 2 stderr"; tail -n 30 "$TMP/tp2.err"; echo "--- dead stderr"; tail -n 20 "$TMP/dead.err"; }
finish
