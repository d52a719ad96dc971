#!/usr/bin/env bash
# --record-memory-history / --memory-snapshot-path (Megatron's flags): a tiny CPU run writes the
# timeline of its tensor allocations: every iteration appears, the bytes in use never go below
# zero and follow the events, the weights allocated before the first iteration are in it, and the
# summary's peak is the largest in_use. A path that cannot be written is one warning, not a failure.
set -u
MEGATRON=$1
source "$2/tests/cli/lib/expect.bash"
RUN=(pretrain --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
     --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --mock-data --vocab-size 100 --train-iters 3 --eval-iters 0
     --log-interval 1
     --no-progress-bar --device cpu --data-cache-path "$TMP/cache")
"$MEGATRON" "${RUN[@]}" --record-memory-history --memory-snapshot-path "$TMP/mem.jsonl" >"$TMP/run.log" 2>&1
check "the run with --record-memory-history trains" grep -qE 'iteration +3/ +3 \|' "$TMP/run.log"
check "it says where the timeline went" grep -q "wrote the memory timeline to $TMP/mem.jsonl" "$TMP/run.log"
check "the timeline is consistent" python3 - "$TMP/mem.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
events, summary = lines[:-1], lines[-1]["summary"]
assert summary["events"] == len(events) > 0 and summary["dropped"] == 0, summary
assert {e["iteration"] for e in events} >= {0, 1, 2, 3}, sorted({e["iteration"] for e in events})
in_use = 0
for e in events:
    assert e["device"] == "cpu", e
    in_use += e["bytes"]
    assert e["in_use"] == in_use >= 0, (e, in_use)
assert summary["peak_in_use"]["cpu"] == max(e["in_use"] for e in events), summary
# The model's weights (2 layers of hidden 32, vocab 100 padded to 128) were allocated before iteration 1.
assert max(e["in_use"] for e in events if e["iteration"] == 0) > 4 * 2 * 128 * 32, "no weights before iteration 1"
PY
"$MEGATRON" "${RUN[@]}" --record-memory-history --memory-snapshot-path "$TMP/no/such/dir/mem.jsonl" >"$TMP/bad.log" 2>&1
check "an unwritable path: the run still ends 0" [ $? = 0 ]
check "an unwritable path: one warning naming the flag" grep -q -- "--memory-snapshot-path: cannot write" "$TMP/bad.log"
expect_error "--memory-snapshot-path must name a file" "${RUN[@]}" --memory-snapshot-path ""
finish
