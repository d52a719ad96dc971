#!/usr/bin/env bash
# End to end through the CLI on mock data: YAML config + flag override, Megatron's log line,
# save, resume with bit-identical losses, generate from the checkpoint.
set -eu
MEGATRON=$1
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fails=0; passes=0
check() { if eval "$2"; then passes=$((passes+1)); else echo "FAIL: $1"; fails=$((fails+1)); fi; }

cat >"$TMP/cfg.yaml" <<'Y'
num-layers: 2
hidden_size: 32
num-attention-heads: 4
group-query-attention: true
num-query-groups: 2
seq-length: 32
normalization: RMSNorm
swiglu: true
position-embedding-type: rope
disable-bias-linear: true
untie-embeddings-and-output-weights: true
micro-batch-size: 2
global-batch-size: 4
lr: 0.003
lr-decay-style: cosine
lr-warmup-iters: 2
mock-data: true
vocab-size: 100
log-interval: 1
eval-interval: 5
eval-iters: 1
seed: 42
Y
run() { "$MEGATRON" pretrain --config "$TMP/cfg.yaml" --no-progress-bar --data-cache-path "$TMP/cache" "$@"; }
run --train-iters 10 >"$TMP/full.log" 2>&1 || { cat "$TMP/full.log"; exit 1; }
check "log line format" "grep -qE '^ iteration +10/ +10 \| consumed samples: +40 \| elapsed time per iteration \(ms\): [0-9.]+ \| throughput \(TFLOP/s\): [0-9.]+ \| tokens per second: [0-9]+ \| learning rate: [0-9.E+-]+ \| global batch size: +4 \| lm loss: [0-9.E+-]+ \| loss scale: 1.0 \| grad norm: [0-9.]+ \| number of skipped iterations: +0 \| number of nan iterations: +0 \|' '$TMP/full.log'"
check "validation block" "grep -q ' validation loss at iteration 5 on validation set | lm loss value: ' '$TMP/full.log'"
check "yaml values used" "grep -q 'model: 2 layers, hidden 32, 4 heads (2 query groups' '$TMP/full.log'"

run --train-iters 10 --exit-interval 6 --save "$TMP/ckpt" --save-interval 3 >"$TMP/a.log" 2>&1 || { cat "$TMP/a.log"; exit 1; }
check "tracker at 6" "[ \"\$(cat $TMP/ckpt/latest_checkpointed_iteration.txt)\" = 6 ]"
check "iter dirs" "[ -f $TMP/ckpt/iter_0000003/metadata.json ] && [ -f $TMP/ckpt/iter_0000006/model.safetensors ]"
run --train-iters 10 --load "$TMP/ckpt" >"$TMP/b.log" 2>&1 || { cat "$TMP/b.log"; exit 1; }
losses() { grep -oE 'iteration +[0-9]+/.*lm loss: [0-9.E+-]+' "$1" | sed -E 's/^ *iteration +([0-9]+)\/.*lm loss: /\1 /'; }
losses "$TMP/full.log" | awk '$1 > 6' >"$TMP/full.l"
losses "$TMP/b.log" >"$TMP/b.l"
check "resumed losses bit-identical" "[ -s $TMP/b.l ] && diff -q $TMP/full.l $TMP/b.l >/dev/null"

"$MEGATRON" generate --load "$TMP/ckpt" --prompt "1 2 3" --max-new-tokens 5 --seed 3 >"$TMP/g.log" 2>&1 || { cat "$TMP/g.log"; exit 1; }
check "generate prints continuation" "grep -qE '^1 2 3' '$TMP/g.log'"
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
