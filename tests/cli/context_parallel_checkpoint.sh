#!/usr/bin/env bash
# Checkpoints under context parallelism (issue #19): CP ranks hold the same parameters and share
# the optimizer's shards with the data-parallel ranks, so a checkpoint saved at CP 2 resumes at
# CP 1 and one saved at CP 1 resumes at CP 2 (the distributed optimizer's shards resharded), and
# the resumed iterations log the losses of an uninterrupted single-process run (a constant learning
# rate: the runs that save stop at another --train-iters, which would change a decaying one).
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
JOB=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
     --global-batch-size 4 --lr 1e-3 --lr-decay-style constant --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar
     --device cpu --tokenizer-type NullTokenizer --log-interval 1 --reset-position-ids --reset-attention-mask
     --eod-mask-loss --position-embedding-type rope --normalization RMSNorm --swiglu --hidden-dropout 0
     --attention-dropout 0 --use-distributed-optimizer)
losses() { grep -o "lm loss: [0-9.E+-]*" "$1" | cut -d' ' -f3; }
one() { OMP_NUM_THREADS=1 "$MEGATRON" pretrain "${JOB[@]}" "$@"; }
cp2() {
  OMP_NUM_THREADS=1 "$MEGATRON" launch --nproc-per-node 2 --master-port $((20000 + RANDOM % 20000)) -- pretrain \
    "${JOB[@]}" --context-parallel-size 2 "$@"
}
# The log line prints the loss to 7 significant digits; CP sums in another order.
same_within() {  # same_within A B: every pair of values within 1e-6 relative
  paste <(echo "$1") <(echo "$2") | awk '{d = $1 - $2; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1} END {exit bad}'
}

one --train-iters 4 >"$TMP/ref.log" 2>&1 || { echo "FAIL: reference run"; tail -20 "$TMP/ref.log"; exit 1; }
want=$(losses "$TMP/ref.log" | tail -2)
check "the reference logs four losses" test "$(losses "$TMP/ref.log" | wc -l)" -eq 4

# resume SAVE LOAD LABEL: iterations 1-2 by SAVE (one or cp2) into a checkpoint, 3-4 by LOAD from it.
resume() {
  local save=$1 load=$2 label=$3 dir="$TMP/ck_$1"
  "$save" --train-iters 2 --save "$dir" --save-interval 2 >"$TMP/save_$1.log" 2>&1 ||
    { echo "FAIL: $label: the save"; tail -20 "$TMP/save_$1.log"; exit 1; }
  "$load" --train-iters 4 --load "$dir" >"$TMP/load_$2.log" 2>&1 ||
    { echo "FAIL: $label: the load"; tail -20 "$TMP/load_$2.log"; exit 1; }
  check "$label: two more losses" test "$(losses "$TMP/load_$2.log" | wc -l)" -eq 2
  check "$label: the uninterrupted losses" same_within "$(losses "$TMP/load_$2.log")" "$want"
}
resume cp2 one "saved at CP 2, resumed at CP 1"
resume one cp2 "saved at CP 1, resumed at CP 2"
finish
