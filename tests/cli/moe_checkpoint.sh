#!/usr/bin/env bash
# Mixture of experts through the CLI: a run with dense and MoE layers (--moe-layer-freq list), a
# gated shared expert and pre-softmax routing saves its experts' settings in the checkpoint;
# logits, a resume, and HF export (Qwen2-MoE, as the model has a shared expert) and re-import
# all rebuild the same model from it alone.
set -u
MEGATRON=$1
source "$(dirname "$0")/lib/expect.bash"
source "$(dirname "$0")/lib/ids_npy.bash"
ARGS=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2 --lr 1e-3
      --mock-data --vocab-size 64 --tokenizer-type NullTokenizer --eval-iters 0 --no-progress-bar --device cpu
      --normalization RMSNorm --swiglu --position-embedding-type rope --disable-bias-linear
      --untie-embeddings-and-output-weights --log-interval 1
      --num-experts 4 --moe-layer-freq '([1]+[0])*2' --moe-ffn-hidden-size 24 --moe-aux-loss-coeff 0.01
      --moe-shared-expert-intermediate-size 16 --moe-shared-expert-gate --moe-router-pre-softmax)

run() { "$MEGATRON" "$@" >"$TMP/out" 2>&1 || { echo "FAIL: megatron $*"; cat "$TMP/out"; exit 1; }; }
loss_at() { grep -o "iteration *$1/.*lm loss: [0-9.E+-]*" "$2" | grep -o "lm loss: .*"; }

run pretrain "${ARGS[@]}" --train-iters 4 --save "$TMP/ck" --save-interval 2
cp "$TMP/out" "$TMP/full.log"
check "the log line reports the load-balancing loss" grep -q "load_balancing_loss:" "$TMP/full.log"
check "the model line counts active parameters" grep -q "active: 2 MoE layers of 4 experts, top-2" "$TMP/full.log"
check "state.json records the experts" grep -q '"moe_layer_freq"' "$TMP/ck/iter_0000004/state.json"

# Resume from iteration 2 with the same flags: iterations 3 and 4 as in the full run.
rm -rf "$TMP/ck2" && mkdir "$TMP/ck2" && cp -r "$TMP/ck/iter_0000002" "$TMP/ck2/" && echo 2 >"$TMP/ck2/latest_checkpointed_iteration.txt"
run pretrain "${ARGS[@]}" --train-iters 4 --load "$TMP/ck2"
check "resumed iteration 4 has the full run's loss" [ "$(loss_at 4 "$TMP/out")" = "$(loss_at 4 "$TMP/full.log")" ]

# Logits from the checkpoint alone, from its HF export, and from that re-imported.
write_ids_npy "$TMP/ids.npy"
run logits --load "$TMP/ck" --input-ids "$TMP/ids.npy" --output "$TMP/native.npy"
run convert --from megatron --to hf --input "$TMP/ck" --output "$TMP/hf"
check "exported as qwen2_moe" grep -q '"model_type": "qwen2_moe"' "$TMP/hf/config.json"
check "its dense layers are listed" grep -q '"mlp_only_layers"' "$TMP/hf/config.json"
run logits --load "$TMP/hf" --input-ids "$TMP/ids.npy" --output "$TMP/hf.npy"
check "HF export gives the same logits" cmp -s "$TMP/native.npy" "$TMP/hf.npy"
run convert --from hf --input "$TMP/hf" --output "$TMP/back"
run logits --load "$TMP/back" --input-ids "$TMP/ids.npy" --output "$TMP/back.npy"
check "re-imported checkpoint gives the same logits" cmp -s "$TMP/native.npy" "$TMP/back.npy"
finish
