#!/usr/bin/env bash
# Checkpoints written before a change load after it: tests/checkpoint/fixtures/native_4bf63f0 was
# saved at iteration 4 by the binary of commit 4bf63f0 (before the session-8 redesign and the
# stricter checkpoint validation), with expected_losses_iter5_8.txt the losses that binary
# printed when it resumed from it. Today's binary must load it and continue with those losses.
MEGATRON=$1
SRC=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$(dirname "$0")/lib/expect.bash"
FIX="$SRC/tests/checkpoint/fixtures/native_4bf63f0"
cp -r "$FIX" "$TMP/ck" && rm -f "$TMP/ck/expected_losses_iter5_8.txt"
before=$(tree_sum "$TMP/ck")
A=(--num-layers 1 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --seq-length 16 --max-position-embeddings 16 --normalization RMSNorm --swiglu --position-embedding-type rope
   --disable-bias-linear --untie-embeddings-and-output-weights --mock-data --vocab-size 128 --micro-batch-size 2
   --global-batch-size 4 --lr 1e-3 --log-interval 1 --eval-iters 0 --no-progress-bar --seed 3 --num-threads 1
   --data-cache-path "$TMP/cache")
"$MEGATRON" pretrain "${A[@]}" --train-iters 8 --load "$TMP/ck" >"$TMP/log" 2>&1
check "resume from the 4bf63f0 checkpoint exits 0" test $? -eq 0
grep -o 'lm loss: [0-9.E+-]*' "$TMP/log" | awk '{print $3}' >"$TMP/losses"
check "four iterations after the checkpoint's 4" test "$(wc -l <"$TMP/losses")" -eq 4
check "losses match the old binary's resume (relative 1e-5)" \
  awk 'NR == FNR {e[FNR] = $1; next} {d = $1 - e[FNR]; if (d < 0) d = -d; if (d > 1e-5 * e[FNR]) bad = 1} END {exit bad}' \
  "$FIX/expected_losses_iter5_8.txt" "$TMP/losses"
check "loading leaves the checkpoint as it was" test "$before" = "$(tree_sum "$TMP/ck")"
[ $fails -eq 0 ] || { echo "--- log"; tail -5 "$TMP/log"; }
finish
