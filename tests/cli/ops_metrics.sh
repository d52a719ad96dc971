#!/usr/bin/env bash
# Watching a run: Prometheus scraped on --metrics-port during training (exposition format,
# localhost only, an oversized request refused), TensorBoard records checked against the schema
# with protoc, the JSON-lines file, Megatron's timer block, --log-op-breakdown's warm-up rule,
# --log-straggler on 2 ranks, and the
# NaN stop naming the iteration and rank of a 2-rank job.
MEGATRON=$1
SRC=$2
source "$(dirname "$0")/lib/expect.bash"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
COMMON=(pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
        --micro-batch-size 1 --global-batch-size 4 --lr 0.003 --mock-data --vocab-size 100 --log-interval 2
        --eval-iters 0 --seed 42 --no-progress-bar --data-cache-path "$TMP/cache")

# Prometheus during a run, stopped by SIGTERM (--exit-signal-handler: exit 0).
port=$(free_port)
: >"$TMP/prom.log"
"$MEGATRON" "${COMMON[@]}" --train-iters 100000 --metrics-port "$port" --exit-signal-handler >"$TMP/prom.log" 2>&1 &
pid=$!
python3 "$SRC/tests/tools/check_prometheus.py" "$port" 120 >"$TMP/scrape.txt" 2>&1
prc=$?
kill -TERM "$pid"; wait "$pid"; rc=$?
check "scrape parses and holds the metrics" [ $prc -eq 0 ]
[ $prc -ne 0 ] && cat "$TMP/scrape.txt" && tail -5 "$TMP/prom.log"
check "run stopped by SIGTERM exits 0 (rc $rc)" [ $rc -eq 0 ]
check "metrics URL logged" grep -q "metrics: Prometheus text format at http://127.0.0.1:$port/metrics" "$TMP/prom.log"

# TensorBoard + JSON lines + timers.
"$MEGATRON" "${COMMON[@]}" --train-iters 4 --tensorboard-dir "$TMP/tb" --metrics-jsonl "$TMP/m.jsonl" \
  --timing-log-level 1 --timing-log-option max --log-timers-to-tensorboard >"$TMP/tb.log" 2>&1
check "tensorboard run exits 0" [ $? -eq 0 ]
check "timer block after the log line" grep -qE '^    forward-backward \.+: [0-9]+\.[0-9]{2}$' "$TMP/tb.log"
check "timer block header" grep -q '^max time across ranks (ms):$' "$TMP/tb.log"
check "two JSON lines" [ "$(grep -c '"type":"train"' "$TMP/m.jsonl")" -eq 2 ]

# --log-op-breakdown leaves the warm-up step out when more steps follow, and says so; a one-step
# run keeps its only step.
"$MEGATRON" "${COMMON[@]}" --train-iters 3 --log-op-breakdown >"$TMP/ops.log" 2>&1
check "breakdown run exits 0" [ $? -eq 0 ]
check "breakdown says the first step is left out" grep -q "op breakdown: the steps after this process's first" "$TMP/ops.log"
check "breakdown line" grep -qE '^time breakdown over [0-9.]+ s: GEMM [0-9.]+%' "$TMP/ops.log"
"$MEGATRON" "${COMMON[@]}" --train-iters 1 --log-op-breakdown >"$TMP/ops1.log" 2>&1
check "one-step breakdown keeps its step" bash -c "! grep -q 'warm-up left out' '$TMP/ops1.log' && grep -qE '^time breakdown over [0-9.]+ s: GEMM' '$TMP/ops1.log'"
if command -v protoc >/dev/null; then
  # protoc decodes the second record (the first scalar) with the schema: field numbers agree.
  python3 - "$TMP"/tb/events.out.tfevents.* >"$TMP/rec.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
at = 16 + n
m = struct.unpack("<Q", b[at:at + 8])[0]
sys.stdout.buffer.write(b[at + 12:at + 12 + m])
PY
  protoc --proto_path="$SRC/src/training/proto" --decode=mt.tb.Event tensorboard_event.proto <"$TMP/rec.bin" >"$TMP/rec.txt" 2>&1
  check "protoc reads the record" grep -q 'tag: "learning-rate"' "$TMP/rec.txt"
  check "protoc sees step 1" grep -q '^step: 1$' "$TMP/rec.txt"
else
  echo "protoc not installed: schema check skipped (scripts/install_deps.sh installs protobuf-compiler)"
fi

# --log-straggler on two ranks names both.
timeout 300 "$MEGATRON" launch --nproc-per-node 2 --master-port "$(free_port)" -- "${COMMON[@]}" --train-iters 4 \
  --log-straggler --straggler-minmax-count 2 >"$TMP/strag.log" 2>&1
check "straggler run exits 0" [ $? -eq 0 ]
check "straggler line names the ranks" grep -qE '^ straggler \| MnRtt/Rnk: [0-9.]+ms/[01] \| MxRtt/Rnk: [0-9.]+ms/[01] \| spread: [0-9.]+% \| slowest: [01] \(.*\), [01] \(' "$TMP/strag.log"
check "no progress bar when stdout is a file" test -z "$(grep -l 'ETA' "$TMP/strag.log")"

# NaN at iteration 3 on rank 1 of 2: the run stops there, naming rank 1.
MT_TEST_NAN_LOSS=3:1 timeout 300 "$MEGATRON" launch --nproc-per-node 2 --master-port "$(free_port)" -- \
  "${COMMON[@]}" --train-iters 6 --log-interval 1 >"$TMP/nan.log" 2>&1
check "NaN stops the run (non-zero)" [ $? -ne 0 ]
check "NaN message names iteration 3 and rank 1" grep -q "iteration 3: the lm loss is nan on rank 1 (its local forward loss); stopping" "$TMP/nan.log"
check "no iteration after the NaN" test -z "$(grep -E '^ iteration +3/' "$TMP/nan.log")"
# Opting out keeps today's skip-and-count.
MT_TEST_NAN_LOSS=3:0 timeout 120 "$MEGATRON" "${COMMON[@]}" --train-iters 4 --log-interval 4 \
  --no-check-for-nan-in-loss-and-grad >"$TMP/skip.log" 2>&1
check "--no-check-for-nan-in-loss-and-grad goes on" [ $? -eq 0 ]
check "and counts the nan iteration" grep -q "number of skipped iterations:   1 | number of nan iterations:   1 |" "$TMP/skip.log"
finish
