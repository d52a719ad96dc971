#!/usr/bin/env bash
# Operating flags (issue #20): TensorBoard, JSON lines, Prometheus, timers, stopping, NaN policy,
# stragglers. Each mistake is one line on stderr naming the flag and a non-zero exit; a
# checkpoint and a TensorBoard directory in place before the failing commands are left intact.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu)

"$MEGATRON" pretrain "${BASE[@]}" --save "$TMP/ck" --save-interval 2 --tensorboard-dir "$TMP/tb" \
  >"$TMP/train.log" 2>&1 || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")
tb_before=$(tree_sum "$TMP/tb")
CK=(--load "$TMP/ck" --save "$TMP/ck" --save-interval 1)

expect_error "--rerun-mode validate_results: Megatron's rerun state machine is not implemented; use --rerun-mode disabled" \
  pretrain "${BASE[@]}" "${CK[@]}" --rerun-mode validate_results
expect_error "--rerun-mode" pretrain "${BASE[@]}" --rerun-mode sometimes
expect_error "--exit-signal SIGFOO: use one of SIGTERM" pretrain "${BASE[@]}" "${CK[@]}" --exit-signal-handler --exit-signal SIGFOO
expect_error "--exit-duration-in-mins: value out of range" pretrain "${BASE[@]}" --exit-duration-in-mins -1
expect_error "--metrics-port: value out of range" pretrain "${BASE[@]}" --metrics-port 70000
expect_error "--metrics-bind-address is for --metrics-port: give the port too" \
  pretrain "${BASE[@]}" --metrics-bind-address 0.0.0.0
expect_error "--metrics-bind-address: give an address" pretrain "${BASE[@]}" --metrics-port 9 --metrics-bind-address ''
# A port that is taken: named, before any training step.
python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' >"$TMP/port" &
held=$!
for _ in $(seq 100); do [ -s "$TMP/port" ] && break; sleep 0.1; done
port=$(cat "$TMP/port")
expect_error "--metrics-port $port: cannot listen on 127.0.0.1:$port" pretrain "${BASE[@]}" "${CK[@]}" --metrics-port "$port"
kill "$held"; wait "$held" 2>/dev/null
expect_error "--metrics-port 9100: cannot listen on 192.0.2.1:9100" \
  pretrain "${BASE[@]}" --metrics-port 9100 --metrics-bind-address 192.0.2.1
: >"$TMP/afile"
expect_error "--tensorboard-dir $TMP/afile: cannot create the directory" pretrain "${BASE[@]}" --tensorboard-dir "$TMP/afile"
expect_error "--metrics-jsonl $TMP/ck: cannot open the file for appending" pretrain "${BASE[@]}" --metrics-jsonl "$TMP/ck"
expect_error "--tensorboard-log-interval: value out of range" pretrain "${BASE[@]}" --tensorboard-log-interval 0
expect_error "--tensorboard-queue-size: value out of range" pretrain "${BASE[@]}" --tensorboard-queue-size 0
expect_error "--timing-log-option" pretrain "${BASE[@]}" --timing-log-option median
expect_error "--timing-log-level must be 0, 1 or 2 (got 3)" pretrain "${BASE[@]}" --timing-log-level 3
expect_error "--straggler-minmax-count: value out of range" pretrain "${BASE[@]}" --log-straggler --straggler-minmax-count 0
expect_error "--straggler-ctrlr-port is a Megatron-LM flag that megatron.cpp does not support yet" \
  pretrain "${BASE[@]}" --straggler-ctrlr-port 65535
expect_error "--check-for-spiky-loss is a Megatron-LM flag that megatron.cpp does not support yet" \
  pretrain "${BASE[@]}" --check-for-spiky-loss
expect_error "--wandb-project is a Megatron-LM flag that megatron.cpp does not support yet" \
  pretrain "${BASE[@]}" --wandb-project p

check "checkpoint intact" [ "$before" = "$(tree_sum "$TMP/ck")" ]
check "tensorboard directory intact" [ "$tb_before" = "$(tree_sum "$TMP/tb")" ]
finish
