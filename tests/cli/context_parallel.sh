#!/usr/bin/env bash
# Context parallelism end to end (issue #19): `megatron launch` starts 4 CPU ranks that train with
# --context-parallel-size 4 --cp-comm-type a2a+p2p and packed documents, and the log line's loss
# at each iteration equals that of the same run on one process (without dropout, whose masks
# are drawn per local element and so differ under CP, as in Megatron).
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
JOB=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
     --global-batch-size 4 --train-iters 3 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar
     --device cpu --tokenizer-type NullTokenizer --log-interval 1 --reset-position-ids --reset-attention-mask
     --eod-mask-loss --position-embedding-type rope --normalization RMSNorm --swiglu --hidden-dropout 0
     --attention-dropout 0)
losses() { grep -o "lm loss: [0-9.E+-]*" "$1" | cut -d' ' -f3; }

OMP_NUM_THREADS=1 "$MEGATRON" pretrain "${JOB[@]}" >"$TMP/one.log" 2>&1 ||
  { echo "FAIL: single-process run"; cat "$TMP/one.log"; exit 1; }
OMP_NUM_THREADS=1 "$MEGATRON" launch --nproc-per-node 4 --master-port $((20000 + RANDOM % 20000)) -- pretrain "${JOB[@]}" --context-parallel-size 4 \
  --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 >"$TMP/cp.log" 2>&1 ||
  { echo "FAIL: context-parallel run"; tail -20 "$TMP/cp.log"; exit 1; }
check "the grid is logged" grep -q "x context-parallel 4 (a2a+p2p)" "$TMP/cp.log"
check "three losses logged" test "$(losses "$TMP/one.log" | wc -l)" -eq 3
# The log line prints the loss to 7 significant digits; sums in another order (the losses of
# other chunks, the CPU's fused output layer per rank) may move the last one.
same_within() {  # same_within A B: every pair of values within 1e-6 relative
  paste <(losses "$1") <(losses "$2") | awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1} END {exit bad}'
}
check "CP 4 (a2a+p2p) logs the single-process losses" same_within "$TMP/cp.log" "$TMP/one.log"
finish
