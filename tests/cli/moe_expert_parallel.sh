#!/usr/bin/env bash
# Expert parallelism through the CLI (`megatron launch`, CPU ranks over Gloo): an MoE model trained
# with EP 2 under both token dispatchers, with TP 2 + SP (expert TP 2, and expert TP 1 with the
# experts split over the TP ranks), logs the single-process losses (1e-5 relative; dropout off, a
# vocabulary padded alike at TP 1 and 2); the EP 2 run's checkpoint (each expert saved once) resumes
# in one process on the uninterrupted run's losses.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --global-batch-size 4 --lr 3e-3 --mock-data --vocab-size 64 --make-vocab-size-divisible-by 64
      --tokenizer-type NullTokenizer --eval-iters 0 --no-progress-bar --device cpu --log-interval 1
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0
      --num-experts 4 --moe-ffn-hidden-size 16 --moe-aux-loss-coeff 0.01 --train-iters 4)

run() {
  local log=$1
  shift
  "$MEGATRON" "$@" >"$log" 2>&1 || { echo "FAIL: megatron $*"; cat "$log"; exit 1; }
}
losses() { grep -oE 'iteration +[0-9]+/.*lm loss: [0-9.E+-]+' "$1" | sed -E 's/^ *iteration +([0-9]+)\/.*lm loss: /\1 /'; }
# The losses of log $1 (iterations $2..) against the single-process run's, 1e-5 relative.
same_losses() {
  losses "$TMP/single.log" | awk -v from="$2" '$1 >= from' >"$TMP/want"
  losses "$1" >"$TMP/got"
  [ -s "$TMP/got" ] && [ "$(wc -l <"$TMP/want")" = "$(wc -l <"$TMP/got")" ] &&
    paste "$TMP/want" "$TMP/got" | awk '{ d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * $2) exit 1 }'
}
launch2() { run "$1" launch --nproc-per-node 2 -- pretrain "${ARGS[@]}" "${@:2}"; }

run "$TMP/single.log" pretrain "${ARGS[@]}"
launch2 "$TMP/ep.log" --expert-model-parallel-size 2 --save "$TMP/ck" --save-interval 2
check "EP 2 (allgather) trains as one process" same_losses "$TMP/ep.log" 1
check "the log names the expert grid" grep -q "experts: expert-parallel 2 x expert-tensor-parallel 1 x expert-data-parallel 1 (allgather dispatcher)" "$TMP/ep.log"
check "each EP rank saved its experts" [ -f "$TMP/ck/iter_0000002/model-ep1-tp0-pp0.safetensors" ]
launch2 "$TMP/a2a.log" --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
check "EP 2 (alltoall) trains as one process" same_losses "$TMP/a2a.log" 1
launch2 "$TMP/tp.log" --tensor-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type alltoall
check "TP 2 + SP with expert TP 2 trains as one process" same_losses "$TMP/tp.log" 1
launch2 "$TMP/tpep.log" --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 \
  --expert-tensor-parallel-size 1
check "TP 2 + SP with EP 2 over the TP ranks trains as one process" same_losses "$TMP/tpep.log" 1

# The EP 2 checkpoint of iteration 2 in one process: iterations 3 and 4 as uninterrupted.
rm -rf "$TMP/ck2" && mkdir "$TMP/ck2" && cp -r "$TMP/ck/iter_0000002" "$TMP/ck2/" && echo 2 >"$TMP/ck2/latest_checkpointed_iteration.txt"
run "$TMP/resumed.log" pretrain "${ARGS[@]}" --load "$TMP/ck2"
check "the EP 2 checkpoint resumes in one process" same_losses "$TMP/resumed.log" 3
finish
