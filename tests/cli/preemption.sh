#!/usr/bin/env bash
# Preemption-safe exits: SIGTERM to `megatron launch` mid-run (--exit-signal-handler) and
# --exit-duration-in-mins (elapsed time faked by MT_TEST_MINUTES_PER_ITERATION) leave a
# checkpoint and exit 0 on every rank, for a 2-rank (DP 2) and a 4-rank (TP 2 x DP 2) CPU job;
# resuming from it gives losses bit-identical (the JSON lines' full doubles) to a run that was
# never interrupted.
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# A constant learning rate: the interrupted run and the reference then agree whatever
# --train-iters says (it only has to be long enough for the signal to come first).
COMMON=(pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
        --micro-batch-size 1 --global-batch-size 4 --lr 0.003 --lr-decay-style constant --mock-data --vocab-size 100
        --hidden-dropout 0.1 --log-interval 1 --eval-iters 0 --seed 42 --no-progress-bar --train-iters 100000
        --data-cache-path "$TMP/cache")

job() {  # job NPROC LOG ARGS...: a launched job in the foreground
  local n=$1 log=$2; shift 2
  timeout 300 "$MEGATRON" launch --nproc-per-node "$n" --master-port "$(free_port)" -- "${COMMON[@]}" "$@" >"$log" 2>&1
}
losses() {  # losses JSONL FROM TO: "iteration lm_loss" with every digit of the double
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o=json.loads(l)
    if o["type"]=="train" and int(sys.argv[2])<=o["iteration"]<=int(sys.argv[3]): print(o["iteration"], repr(o["lm_loss"]))' "$@"
}
# resumes_identically NPROC CKPT K LAYOUT...: iterations K+1, K+2 from CKPT equal the uninterrupted run's.
resumes_identically() {
  local n=$1 ck=$2 k=$3; shift 3
  local to=$((k + 2))
  job "$n" "$TMP/ref.log" "$@" --exit-interval "$to" --metrics-jsonl "$TMP/ref.jsonl" || { cat "$TMP/ref.log"; return 1; }
  job "$n" "$TMP/res.log" "$@" --exit-interval "$to" --load "$ck" --metrics-jsonl "$TMP/res.jsonl" ||
    { cat "$TMP/res.log"; return 1; }
  losses "$TMP/ref.jsonl" $((k + 1)) "$to" >"$TMP/ref.l"
  losses "$TMP/res.jsonl" $((k + 1)) "$to" >"$TMP/res.l"
  rm -f "$TMP/ref.jsonl" "$TMP/res.jsonl"
  [ "$(wc -l <"$TMP/ref.l")" -eq 2 ] && diff "$TMP/ref.l" "$TMP/res.l"
}

for layout in "2" "4 --tensor-model-parallel-size 2"; do
  read -r n extra <<<"$layout"
  # shellcheck disable=SC2206
  args=($extra)
  ck="$TMP/sig$n"
  log="$TMP/sig$n.log"
  port=$(free_port)
  : >"$log"
  timeout 300 "$MEGATRON" launch --nproc-per-node "$n" --master-port "$port" --grace-seconds 60 -- "${COMMON[@]}" "${args[@]}" \
    --save "$ck" --exit-signal-handler >"$log" 2>&1 &
  pid=$!
  # The signal goes to the launcher once the ranks train (iteration 3 logged).
  for _ in $(seq 1200); do grep -qE '^ iteration +3/' "$log" && break; sleep 0.1; done
  # A second SIGTERM right after the first (an impatient scheduler or user) lands while the
  # ranks finish the iteration or save: it changes nothing, the save completes.
  kill -TERM "$pid"; sleep 0.05; kill -TERM "$pid"
  wait "$pid"; rc=$?
  check "$n ranks: SIGTERM -> launcher exits 0 (rc $rc)" [ "$rc" -eq 0 ]
  check "$n ranks: every rank exited 0" grep -q "every rank exited 0 after the signal" "$log"
  check "$n ranks: exit message names the signal" grep -q "received SIGTERM (--exit-signal-handler)" "$log"
  k=$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
  check "$n ranks: checkpoint at the stopping iteration ($k)" grep -qE "exiting at iteration $k: " "$log"
  check "$n ranks: stopped mid-run" test "$k" -ge 3 -a "$k" -lt 100000
  [ $rc -ne 0 ] && tail -20 "$log"
  check "$n ranks: resume after SIGTERM is bit-identical" resumes_identically "$n" "$ck" "$k" "${args[@]}"

  ck="$TMP/dur$n"
  MT_TEST_MINUTES_PER_ITERATION=1 job "$n" "$TMP/dur.log" "${args[@]}" --save "$ck" --exit-duration-in-mins 3
  rc=$?
  check "$n ranks: --exit-duration-in-mins exits 0 (rc $rc)" [ "$rc" -eq 0 ]
  check "$n ranks: time limit stops at iteration 3" grep -q "exiting at iteration 3: the run has trained" "$TMP/dur.log"
  check "$n ranks: checkpoint at 3" [ "$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null)" = 3 ]
  check "$n ranks: resume after the time limit is bit-identical" resumes_identically "$n" "$ck" 3 "${args[@]}"
done

# Without --save the run still stops cleanly, and says that nothing was saved.
MT_TEST_MINUTES_PER_ITERATION=1 timeout 120 "$MEGATRON" "${COMMON[@]}" --exit-duration-in-mins 2 >"$TMP/nosave.log" 2>&1
check "no --save: exit 0" [ $? -eq 0 ]
check "no --save: says so" grep -q "exiting at iteration 2: .*(no --save: nothing saved)" "$TMP/nosave.log"
finish
