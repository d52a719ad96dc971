#!/usr/bin/env bash
# Context parallelism, packed documents and --distribute-saved-activations (issue #19): each
# mistake in --context-parallel-size, --cp-comm-type, --hierarchical-context-parallel-sizes, the
# packed-document flags and --distribute-saved-activations is one line on stderr naming the flag
# and a non-zero exit, found before any rank connects; a checkpoint in place before the failing
# commands is left as it was.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu
      --tokenizer-type NullTokenizer)

"$MEGATRON" pretrain "${BASE[@]}" --save "$TMP/ck" --save-interval 2 >"$TMP/train.log" 2>&1 ||
  { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")

# Packed documents train on one process (positions and attention restart after each EOD).
"$MEGATRON" pretrain "${BASE[@]}" --reset-position-ids --reset-attention-mask --eod-mask-loss >"$TMP/packed.log" 2>&1 ||
  { echo "FAIL: packed documents did not train"; cat "$TMP/packed.log"; exit 1; }

expect_error "--cp-comm-type got 'ring'; expected one of: p2p, a2a, allgather, a2a+p2p" pretrain "${BASE[@]}" --cp-comm-type ring
expect_error "--distribute-saved-activations splits saved inputs over tensor-parallel ranks: it needs --tensor-model-parallel-size > 1" \
  pretrain "${BASE[@]}" --distribute-saved-activations --recompute-granularity full --recompute-method uniform \
  --recompute-num-layers 1
expect_error "--hierarchical-context-parallel-sizes applies to --cp-comm-type a2a+p2p only (got --cp-comm-type p2p)" \
  pretrain "${BASE[@]}" --hierarchical-context-parallel-sizes 1 1

# The parallel rules: a four-rank environment, this rank alone (checked before connecting).
export WORLD_SIZE=4 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 MT_STORE_SECRET=0123456789abcdef0123
expect_error "--seq-length (12) must be divisible by 2 x --context-parallel-size = 8" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --seq-length 12
expect_error "--cp-comm-type a2a: the 2 attention heads per tensor-parallel rank must be divisible by the all-to-all size 4" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a --tensor-model-parallel-size 1 \
  --num-attention-heads 2 --hidden-size 32
expect_error "--cp-comm-type a2a: the 2 key/value groups per tensor-parallel rank must be divisible by the all-to-all size 4" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a --group-query-attention --num-query-groups 2
expect_error "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a+p2p
expect_error "--hierarchical-context-parallel-sizes 2 x 1 = 2 must equal --context-parallel-size 4" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 1
expect_error "--hierarchical-context-parallel-sizes takes two sizes (all-to-all, ring), got 3" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 1 2
expect_error "--hierarchical-context-parallel-sizes: 'x' is not a positive size" \
  pretrain "${BASE[@]}" --context-parallel-size 4 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes x 4
WORLD_SIZE=8 expect_error "--sequence-parallel with --context-parallel-size 2: the 10 tokens per CP rank (--seq-length 20 / CP) must be divisible by --tensor-model-parallel-size 4" \
  pretrain "${BASE[@]}" --context-parallel-size 2 --tensor-model-parallel-size 4 --sequence-parallel --seq-length 20 \
  --max-position-embeddings 20
expect_error "world size 4 is not divisible by --tensor-model-parallel-size (1) x --pipeline-model-parallel-size (1) x --context-parallel-size (3)" \
  pretrain "${BASE[@]}" --context-parallel-size 3

# --distribute-saved-activations: Megatron's rules.
expect_error "--distribute-saved-activations applies to --recompute-granularity full only" \
  pretrain "${BASE[@]}" --tensor-model-parallel-size 2 --distribute-saved-activations
expect_error "--distribute-saved-activations cannot be combined with --sequence-parallel" \
  pretrain "${BASE[@]}" --tensor-model-parallel-size 2 --sequence-parallel --distribute-saved-activations \
  --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
unset WORLD_SIZE RANK LOCAL_RANK MASTER_ADDR MASTER_PORT MT_STORE_SECRET

check "the checkpoint is unchanged by the failing commands" test "$(tree_sum "$TMP/ck")" = "$before"
finish
