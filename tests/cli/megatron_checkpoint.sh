#!/usr/bin/env bash
# Resuming from Megatron-LM's own checkpoints (issue #21): tests/fixtures/megatron_ckpt holds
# checkpoints Megatron-LM wrote at iteration 5 (torch_dist fp32, legacy torch fp32, torch_dist
# bf16 with the distributed optimizer) and the losses it logged for iterations 1-10. Loading them
# and training to 10 with the README's flags must reproduce iterations 6-10: fp32 within 1e-5
# relative, bf16 within bf16 tolerance, and so under TP=2 and PP=2 (two CPU processes) as well.
MEGATRON=$1
SRC=${2:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$(dirname "$0")/lib/expect.bash"
FIX="$SRC/tests/fixtures/megatron_ckpt"
cp -r "$FIX" "$TMP/fx" && chmod -R u+w "$TMP/fx"
cd "$TMP/fx" || exit 1
before=$(tree_sum "$TMP/fx")
# The README's flags (--transformer-impl local and the fusion switches are accepted as no-ops).
A=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --ffn-hidden-size 128 --seq-length 64 --max-position-embeddings 64 --normalization RMSNorm --swiglu
   --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
   --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --min-lr 1e-4
   --lr-decay-style cosine --lr-warmup-iters 2 --lr-decay-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
   --data-path data/fix_text_document --split 98,2,0 --tokenizer-type NullTokenizer --vocab-size 511
   --log-interval 1 --eval-iters 0 --eval-interval 1000 --train-iters 15 --exit-interval 10
   --no-gradient-accumulation-fusion --no-rope-fusion --no-masked-softmax-fusion --no-persist-layer-norm
   --transformer-impl local --no-progress-bar --data-cache-path "$TMP/cache")

# resume NAME TOLERANCE LABEL [launch args --] [extra flags]: losses 6-10 against Megatron's log.
resume() {
  local name=$1 tol=$2 label=$3; shift 3
  local log="$TMP/log.$label"
  if [ "${1:-}" = launch ]; then
    shift
    OMP_NUM_THREADS=1 timeout 600 "$MEGATRON" launch --nproc-per-node 2 --master-port $((20000 + RANDOM % 20000)) \
      -- pretrain "${A[@]}" --load "$name" "$@" >"$log" 2>&1
  else
    timeout 600 "$MEGATRON" pretrain "${A[@]}" --num-threads 1 --load "$name" "$@" >"$log" 2>&1
  fi
  check "$label: resume exits 0" test $? -eq 0
  grep -o 'lm loss: [0-9.E+-]*' "$log" | awk '{print $3}' >"$TMP/got.$label"
  awk '$1 >= 6 {print $2}' "$name.losses_1_10" >"$TMP/want.$label"
  check "$label: iterations 6-10 after the checkpoint's 5" test "$(wc -l <"$TMP/got.$label")" -eq 5
  check "$label: losses match Megatron-LM's within $tol relative" \
    awk -v tol="$tol" 'NR == FNR {e[FNR] = $1; next} {d = $1 - e[FNR]; if (d < 0) d = -d; if (d > tol * e[FNR]) bad = 1} END {exit bad}' \
    "$TMP/want.$label" "$TMP/got.$label"
  grep -q "loaded checkpoint from $name at iteration 5" "$log"
  check "$label: says it loaded iteration 5" test $? -eq 0
  [ $fails -eq 0 ] || { echo "--- $label"; tail -5 "$log"; }
}

resume ck_dist 1e-5 torch_dist
resume ck_torch 1e-5 torch
resume ck_distopt 1e-3 torch_dist_bf16_distopt --bf16 --use-distributed-optimizer
resume ck_dist 1e-5 torch_dist_tp2 launch --tensor-model-parallel-size 2
resume ck_dist 1e-5 torch_dist_pp2 launch --pipeline-model-parallel-size 2
resume ck_distopt 1e-3 distopt_dp2 launch --bf16 --use-distributed-optimizer

# --use-checkpoint-args: the model and tokenizer flags from the Megatron-LM checkpoint's args.
U=(--attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --min-lr 1e-4
   --lr-decay-style cosine --lr-warmup-iters 2 --lr-decay-iters 20 --weight-decay 0.1 --clip-grad 1.0 --seed 1234
   --data-path data/fix_text_document --split 98,2,0 --log-interval 1 --eval-iters 0 --train-iters 15
   --exit-interval 6 --no-progress-bar --num-threads 1 --data-cache-path "$TMP/cache")
"$MEGATRON" pretrain --use-checkpoint-args --load ck_torch "${U[@]}" >"$TMP/log.args" 2>&1
check "--use-checkpoint-args from a torch checkpoint exits 0" test $? -eq 0
check "--use-checkpoint-args continues with Megatron-LM's iteration 6 loss" \
  grep -q "lm loss: $(awk '$1 == 6 {print $2}' ck_torch.losses_1_10)" "$TMP/log.args"

# megatron convert: to native (weights, Adam state, training state) and resume from that; to HF.
"$MEGATRON" convert --from megatron-torch-dist --input ck_distopt --output "$TMP/native" >"$TMP/log.conv" 2>&1
check "convert --from megatron-torch-dist exits 0" test $? -eq 0
check "the converted checkpoint keeps the optimizer state" grep -q "with its optimizer state" "$TMP/log.conv"
cp ck_distopt.losses_1_10 "$TMP/native.losses_1_10"
resume "$TMP/native" 1e-3 converted_distopt --bf16 --use-distributed-optimizer
"$MEGATRON" convert --from megatron-torch --to hf --input ck_torch --output "$TMP/hf" >/dev/null 2>&1
check "convert --from megatron-torch --to hf writes a model" test -s "$TMP/hf/model.safetensors"
"$MEGATRON" pretrain "${A[@]}" --num-threads 1 --load "$TMP/hf" --exit-interval 1 >"$TMP/log.hf" 2>&1
check "the exported HuggingFace model loads" test $? -eq 0

# Back to Megatron-LM: torch_dist written from the legacy checkpoint resumes alike here (the
# Megatron-LM side: tests/tools/check_torch_dist_in_megatron.py on a machine with torch).
"$MEGATRON" convert --from megatron-torch --to megatron-torch-dist --input ck_torch --output "$TMP/back" >/dev/null 2>&1
check "convert --to megatron-torch-dist exits 0" test -s "$TMP/back/iter_0000005/.metadata"
cp ck_torch.losses_1_10 "$TMP/back.losses_1_10"
resume "$TMP/back" 1e-5 written_torch_dist

# pretrain --save with --ckpt-format torch_dist (under TP=2): a torch_dist checkpoint at 8, and
# resuming from it continues with Megatron-LM's losses 9 and 10.
OMP_NUM_THREADS=1 timeout 600 "$MEGATRON" launch --nproc-per-node 2 --master-port $((20000 + RANDOM % 20000)) -- \
  pretrain "${A[@]}" --tensor-model-parallel-size 2 --load ck_dist --save "$TMP/sv" --ckpt-format torch_dist \
  --save-interval 8 --exit-interval 8 >"$TMP/log.sv" 2>&1
check "pretrain --ckpt-format torch_dist --save exits 0" test $? -eq 0
check "it wrote a torch_dist checkpoint at iteration 8" test -s "$TMP/sv/iter_0000008/.metadata"
check "and no native staging copy is left" test ! -e "$TMP/sv/.native_staging"
"$MEGATRON" pretrain "${A[@]}" --num-threads 1 --load "$TMP/sv" --ckpt-format torch_dist >"$TMP/log.sv2" 2>&1
grep -o 'lm loss: [0-9.E+-]*' "$TMP/log.sv2" | awk '{print $3}' >"$TMP/got.sv"
awk '$1 >= 9 {print $2}' ck_dist.losses_1_10 >"$TMP/want.sv"
check "resuming from it gives Megatron-LM's losses 9 and 10" \
  awk 'NR == FNR {e[FNR] = $1; n++; next} {d = $1 - e[FNR]; if (d < 0) d = -d; if (d > 1e-5 * e[FNR]) bad = 1; m++} END {exit bad || m != n || n != 2}' \
  "$TMP/want.sv" "$TMP/got.sv"

check "loading leaves the checkpoints as they were" test "$before" = "$(tree_sum "$TMP/fx")"
finish
