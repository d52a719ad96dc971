#!/usr/bin/env bash
# Flags, --config YAML and generate's options (issue #27): absurd sizes, out-of-range and
# non-finite numbers, 0 given for a default, prompts beyond the context. Each is one line on
# stderr naming the flag and a non-zero exit, never a crash, a hang or a silent default; a
# checkpoint in place before the failing commands is left as it was.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar --device cpu)
LLAMA=(--normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear)

# A checkpoint to generate from, and to show that failing runs pointed at it leave it intact.
"$MEGATRON" pretrain "${BASE[@]}" --tokenizer-type NullTokenizer --save "$TMP/ck" --save-interval 2 \
  >"$TMP/train.log" 2>&1 || { echo "FAIL: could not train the fixture"; cat "$TMP/train.log"; exit 1; }
before=$(tree_sum "$TMP/ck")
SAVE=(--save "$TMP/ck" --load "$TMP/ck" --save-interval 1)

# Sizes: refused by name before anything is allocated (were SIGSEGV / SIGABRT).
expect_error "--hidden-size: value out of range (got 4611686018427387904; expected 1 to 1048576)" \
  pretrain "${BASE[@]}" "${LLAMA[@]}" "${SAVE[@]}" --hidden-size 4611686018427387904
expect_error "--seq-length: value out of range (got 4611686018427387904; expected 1 to 16777216)" \
  pretrain "${BASE[@]}" "${LLAMA[@]}" "${SAVE[@]}" --seq-length 4611686018427387904
expect_error "--num-layers: value out of range (got 1000000000; expected 1 to 65536)" \
  pretrain "${BASE[@]}" "${SAVE[@]}" --num-layers 1000000000
expect_error "needs at least" pretrain "${BASE[@]}" "${SAVE[@]}" --num-layers 4096 --hidden-size 65536 --num-attention-heads 512
expect_error "--micro-batch-size 1024 x --seq-length 16777216 = 17179869184 tokens per micro-batch" \
  pretrain "${BASE[@]}" "${LLAMA[@]}" --seq-length 16777216 --micro-batch-size 1024
expect_error "--train-iters x --global-batch-size (training samples)" \
  pretrain "${BASE[@]}" --train-iters 281474976710656 --global-batch-size 65536

# Numbers out of range (were "expects an integer" / "internal error"), never narrowed.
expect_error "--num-layers: value out of range (got 99999999999999999999" pretrain "${BASE[@]}" --num-layers 99999999999999999999
expect_error "--lr: value out of range (got 1e999" pretrain "${BASE[@]}" --lr 1e999
expect_error "--num-threads: value out of range (got 99999999999; expected 0 to 4096)" pretrain "${BASE[@]}" --num-threads 99999999999
expect_error "--tensor-model-parallel-size: value out of range" pretrain "${BASE[@]}" --tensor-model-parallel-size 4294967296
expect_error "--make-vocab-size-divisible-by: value out of range" pretrain "${BASE[@]}" --make-vocab-size-divisible-by 4611686018427387904
expect_error "--distributed-timeout-minutes: value out of range" pretrain "${BASE[@]}" --distributed-timeout-minutes 999999999999999

# 0 is not a way to ask for the default; inf and nan are not numbers any flag accepts.
expect_error "--ffn-hidden-size: value out of range (got 0; expected 1 to" pretrain "${BASE[@]}" "${SAVE[@]}" --ffn-hidden-size 0
expect_error "--lr must be a finite number, got 'inf'" pretrain "${BASE[@]}" "${SAVE[@]}" --lr inf
expect_error "--clip-grad must be a finite number, got 'nan'" pretrain "${BASE[@]}" "${SAVE[@]}" --clip-grad nan
expect_error "--adam-beta1 must be in [0, 1) (got 1)" pretrain "${BASE[@]}" --adam-beta1 1
expect_error "--attention-dropout must be a finite number" pretrain "${BASE[@]}" --attention-dropout nan

# --config YAML of any shape: one line naming the file (a nested list escaped as SIGABRT).
printf 'data_path: [[a, b]]\n' >"$TMP/nested.yaml"
expect_error "--config $TMP/nested.yaml: --data-path: list entries must be plain values" pretrain --config "$TMP/nested.yaml"
printf '[a, b]: 1\n' >"$TMP/key.yaml"
expect_error "--config $TMP/key.yaml: keys must be flag names" pretrain --config "$TMP/key.yaml"
printf 'lr: inf\n' >"$TMP/inf.yaml"
expect_error "--config $TMP/inf.yaml: --lr must be a finite number" pretrain --config "$TMP/inf.yaml"
mkfifo "$TMP/fifo.yaml"
expect_error "--config: '$TMP/fifo.yaml' is not a regular file" pretrain --config "$TMP/fifo.yaml"
expect_error "--config: '$TMP' is a directory" pretrain --config "$TMP"

# generate: sampling options, the context, and the Null tokenizer's spacing.
GEN=(generate --load "$TMP/ck" --prompt "1 2 3")
expect_error "--temperature must be a finite number, got 'nan'" "${GEN[@]}" --temperature nan
expect_error "--top-p must be a finite number, got 'nan'" "${GEN[@]}" --top-p nan
expect_error "--top-p must be in (0, 1] (got 0)" "${GEN[@]}" --top-p 0
expect_error "--top-p must be in (0, 1] (got 1.5)" "${GEN[@]}" --top-p 1.5
expect_error "--top-k: value out of range (got -3" "${GEN[@]}" --top-k -3
expect_error "--temperature must be >= 0 (got -1)" "${GEN[@]}" --temperature -1
expect_error "--prompt (3 tokens) + --max-new-tokens (1000000000) exceeds the model's context of 16 tokens" \
  "${GEN[@]}" --max-new-tokens 1000000000
expect_error "--prompt is 17 tokens but the model's context is 16" \
  generate --load "$TMP/ck" --prompt "$(seq -s ' ' 1 17)" --max-new-tokens 0
expect_error "--num-threads: value out of range" "${GEN[@]}" --num-threads 99999999999
expect_error "--num-threads: value out of range" convert --from hf --input "$TMP/none" --output "$TMP/out" --num-threads 99999999999
expect_error "--max-shard-size-mb: value out of range" convert --from megatron --input "$TMP/ck" --output "$TMP/out" \
  --max-shard-size-mb 9223372036854775807
expect_error "--iteration: value out of range (got -1" logits --load "$TMP/ck" --input-ids x.npy --output y.npy --iteration -1

# The continuation stays space-separated after the prompt (was "... 8" + "9 10" -> "... 89 10").
"$MEGATRON" generate --load "$TMP/ck" --prompt "1 2 3 4 5 6 7 8" --max-new-tokens 4 --temperature 0 \
  >"$TMP/gen.out" 2>"$TMP/gen.err"
check "generate separates prompt and continuation: $(cat "$TMP/gen.out" "$TMP/gen.err")" \
  grep -qE '^1 2 3 4 5 6 7 8( [0-9]+){1,4}$' "$TMP/gen.out"
# Without --max-new-tokens the default is cut to what the context leaves (16 - 13).
"$MEGATRON" generate --load "$TMP/ck" --prompt "$(seq -s ' ' 1 13)" --temperature 0 >"$TMP/gen2.out" 2>"$TMP/gen2.err"
check "default --max-new-tokens fits the context: $(cat "$TMP/gen2.err")" \
  test "$(wc -w <"$TMP/gen2.out")" -le 16 -a "$(wc -w <"$TMP/gen2.out")" -gt 13

check "the checkpoint is intact after the failing commands" test "$before" = "$(tree_sum "$TMP/ck")"
finish
