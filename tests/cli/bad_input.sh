#!/usr/bin/env bash
# Every user mistake: exactly one line on stderr naming the flag or file, exit code != 0, no stack dump.
set -u
MEGATRON=$1
fails=0; passes=0
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar)

expect_error() {  # expect_error "needle" args...
  local needle=$1; shift
  "$MEGATRON" "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ $rc -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$needle" "$TMP/err"; then
    echo "FAIL: megatron $* -> rc=$rc, stderr ($lines lines):"; cat "$TMP/err"; fails=$((fails+1))
  else
    passes=$((passes+1))
  fi
}

expect_error "unknown command 'pretrian' (did you mean 'pretrain'?)" pretrian
expect_error "unknown flag --num-layer (did you mean --num-layers?)" pretrain "${BASE[@]}" --num-layer 3
expect_error "--num-layers expects an integer, got 'two'" pretrain "${BASE[@]}" --num-layers two
expect_error "--num-attention-heads (4) must be divisible by --num-query-groups (3)" pretrain "${BASE[@]}" --group-query-attention --num-query-groups 3
expect_error "--num-query-groups needs --group-query-attention" pretrain "${BASE[@]}" --num-query-groups 2
expect_error "--hidden-size (30) must be divisible by --num-attention-heads (4)" pretrain "${BASE[@]}" --hidden-size 30
expect_error "--global-batch-size (5) is not divisible by --micro-batch-size (2)" pretrain "${BASE[@]}" --global-batch-size 5
expect_error "--normalization got 'RMSnorm'" pretrain "${BASE[@]}" --normalization RMSnorm
expect_error "did you mean 'RMSNorm'" pretrain "${BASE[@]}" --normalization RMSnorm
expect_error "use only one of --train-iters and --train-samples" pretrain "${BASE[@]}" --train-samples 10
expect_error "--moe-input-jitter-eps is a Megatron-LM flag" pretrain "${BASE[@]}" --num-experts 8 --moe-input-jitter-eps 0.1
expect_error "--tensor-model-parallel-size" pretrain "${BASE[@]}" --tensor-model-parallel-size 0
expect_error "--config: cannot read '$TMP/nope.yaml'" pretrain --config "$TMP/nope.yaml"
printf 'num_layers: 2\nhidden-sizee: 32\n' >"$TMP/bad.yaml"
expect_error "--config $TMP/bad.yaml: unknown flag --hidden-sizee" pretrain --config "$TMP/bad.yaml"
expect_error "--load '$TMP/missing' does not exist and --exit-on-missing-checkpoint is set" pretrain "${BASE[@]}" --load "$TMP/missing" --exit-on-missing-checkpoint
expect_error "--load DIR is required" generate --prompt hi
expect_error "--lr must be positive" pretrain "${BASE[@]}" --lr 0
expect_error "--seq-length (16) exceeds --max-position-embeddings (8)" pretrain "${BASE[@]}" --max-position-embeddings 8
expect_error "--recompute-granularity got 'partial'" pretrain "${BASE[@]}" --recompute-granularity partial
expect_error "--recompute-granularity full needs --recompute-method uniform or block" pretrain "${BASE[@]}" --recompute-granularity full
expect_error "--recompute-granularity full needs --recompute-num-layers N" pretrain "${BASE[@]}" --recompute-granularity full --recompute-method uniform
expect_error "--recompute-num-layers must be between 1 and the layers per pipeline stage (2); got 3" pretrain "${BASE[@]}" --recompute-granularity full --recompute-method block --recompute-num-layers 3
expect_error "--recompute-num-layers must be between 1 and the layers per pipeline stage (2); got 0" pretrain "${BASE[@]}" --recompute-granularity full --recompute-method uniform --recompute-num-layers 0
expect_error "--recompute-method is not supported with --recompute-granularity selective" pretrain "${BASE[@]}" --recompute-granularity selective --recompute-method block
expect_error "--recompute-num-layers is not supported with --recompute-granularity selective" pretrain "${BASE[@]}" --recompute-granularity selective --recompute-num-layers 1
expect_error "--recompute-method and --recompute-num-layers need --recompute-granularity full" pretrain "${BASE[@]}" --recompute-method uniform --recompute-num-layers 1
expect_error "--recompute-activations means --recompute-granularity selective" pretrain "${BASE[@]}" --recompute-activations --recompute-granularity full
expect_error "--recompute-modules needs --recompute-granularity selective" pretrain "${BASE[@]}" --recompute-modules moe_act
expect_error "--recompute-modules got 'attn'; expected core_attn, moe_act or moe" pretrain "${BASE[@]}" --recompute-granularity selective --recompute-modules core_attn attn
expect_error "--recompute-modules mlp: megatron.cpp recomputes core_attn, moe_act and moe; 'mlp' is not implemented yet" pretrain "${BASE[@]}" --recompute-granularity selective --recompute-modules mlp
expect_error "--fp16 and --bf16 cannot be used together" pretrain "${BASE[@]}" --fp16 --bf16
expect_error "--loss-scale needs --fp16" pretrain "${BASE[@]}" --loss-scale 1024
expect_error "--initial-loss-scale needs --fp16" pretrain "${BASE[@]}" --bf16 --initial-loss-scale 65536
expect_error "--hysteresis must be > 0, got 0" pretrain "${BASE[@]}" --fp16 --hysteresis 0
expect_error "--min-loss-scale (8) must not exceed --initial-loss-scale (4)" pretrain "${BASE[@]}" --fp16 --min-loss-scale 8 --initial-loss-scale 4
expect_error "--device cuda trains in bf16 or fp16: add --bf16 (or --fp16)" pretrain "${BASE[@]}" --device cuda
mkdir -p "$TMP/ck" && echo "abc" >"$TMP/ck/latest_checkpointed_iteration.txt"
expect_error "should hold an iteration number" pretrain "${BASE[@]}" --load "$TMP/ck"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
