#!/usr/bin/env bash
# --apply-layernorm-1p through the CLI: a trained model's zero-centred norm weights (stored w - 1)
# export to HuggingFace as 1 + w (HF's logits equal the checkpoint's, bit for bit), import back
# into a 1p model as w - 1 (it trains as a plain model loading them) and into a plain checkpoint
# through convert.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
source "$(dirname "$0")/lib/ids_npy.bash"
ARGS=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-2
      --mock-data --vocab-size 64 --tokenizer-type NullTokenizer --eval-iters 0 --no-progress-bar --device cpu
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --log-interval 1)

run() { "$MEGATRON" "$@" >"$TMP/out" 2>&1 || { echo "FAIL: megatron $*"; cat "$TMP/out"; exit 1; }; }
loss_at() { grep -o "iteration *$1/.*lm loss: [0-9.E+-]*" "$2" | grep -o "lm loss: .*"; }

run pretrain "${ARGS[@]}" --apply-layernorm-1p --train-iters 4 --save "$TMP/ck"
check "state.json records the zero-centred norms" grep -q '"layernorm_zero_centered_gamma": true' "$TMP/ck/iter_0000004/state.json"

write_ids_npy "$TMP/ids.npy"
run logits --load "$TMP/ck" --input-ids "$TMP/ids.npy" --output "$TMP/native.npy"
run convert --from megatron --to hf --input "$TMP/ck" --output "$TMP/hf"
run logits --load "$TMP/hf" --input-ids "$TMP/ids.npy" --output "$TMP/hf.npy"
check "HF export (norms as 1 + w) gives the same logits" cmp -s "$TMP/native.npy" "$TMP/hf.npy"
run convert --from hf --input "$TMP/hf" --output "$TMP/back"
run logits --load "$TMP/back" --input-ids "$TMP/ids.npy" --output "$TMP/back.npy"
check "re-imported as a plain model, the same logits" cmp -s "$TMP/native.npy" "$TMP/back.npy"

# HF's weights into a 1p model (norms stored as w - 1) and into a plain one: equal losses (the
# native checkpoint's padded vocabulary rows are not in the export, so it is not the comparison).
run pretrain "${ARGS[@]}" --train-iters 1 --load "$TMP/hf"
cp "$TMP/out" "$TMP/plain.log"
run pretrain "${ARGS[@]}" --apply-layernorm-1p --train-iters 1 --load "$TMP/hf"
check "HF weights loaded into a 1p model train as in a plain one" \
  [ -n "$(loss_at 1 "$TMP/out")" -a "$(loss_at 1 "$TMP/out")" = "$(loss_at 1 "$TMP/plain.log")" ]
run pretrain "${ARGS[@]}" --apply-layernorm-1p --train-iters 1 --load "$TMP/ck" --finetune
cp "$TMP/out" "$TMP/native.log"
# Without the flag the norms would read w - 1 as the scale: a different loss.
run pretrain "${ARGS[@]}" --train-iters 1 --load "$TMP/ck" --finetune
check "the flag changes what the stored weights mean" [ "$(loss_at 1 "$TMP/out")" != "$(loss_at 1 "$TMP/native.log")" ]
finish
