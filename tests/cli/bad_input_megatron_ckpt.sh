#!/usr/bin/env bash
# Broken and hostile Megatron-LM checkpoints (issue #21): one clear line naming the file or the
# flag, a non-zero exit, and nothing run: a .metadata pickle that calls os.system is refused by
# name and the command it holds never runs. What the command only reads stays as it was.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
FIX=$SRC/tests/fixtures/megatron_ckpt
A=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --ffn-hidden-size 128 --seq-length 64 --max-position-embeddings 64 --normalization RMSNorm --swiglu
   --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights
   --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --train-iters 15 --mock-data --tokenizer-type NullTokenizer
   --vocab-size 511 --eval-iters 0 --no-progress-bar --num-threads 1 --data-cache-path "$TMP/cache")

# bad NAME: a fresh writable copy of fixture NAME at $TMP/bad.
bad() { rm -rf "$TMP/bad"; cp -r "$FIX/$1" "$TMP/bad"; chmod -R u+w "$TMP/bad"; }
B=$TMP/bad
IT=$B/iter_0000005
expect_intact() {
  local before; before=$(tree_sum "$B")
  expect_error "$@"
  check "the checkpoint at $B is unchanged after: $*" [ "$(tree_sum "$B")" = "$before" ]
}

# A .metadata that would run `touch $TMP/pwned` when unpickled by Python.
bad ck_dist
# (protocol 0: Python's pickle.load would run it; megatron.cpp stops at the GLOBAL).
printf 'cos\nsystem\n(Vtouch %s\ntR.' "$TMP/pwned" >"$IT/.metadata"
expect_intact "os.system, which is not on the allow-list" pretrain "${A[@]}" --load "$B"
check "the pickle's command never ran" test ! -e "$TMP/pwned"

# A global outside the allow-list inside a torch.save archive's data.pkl is refused the same way;
# a truncated data file, a missing one, a corrupt zip.
bad ck_dist
head -c 100000 "$IT/__0_0.distcp" >"$TMP/part" && cp "$TMP/part" "$IT/__0_0.distcp"
expect_intact "truncated or corrupt" pretrain "${A[@]}" --load "$B"
bad ck_dist
rm "$IT/__0_0.distcp"
expect_intact "__0_0.distcp" pretrain "${A[@]}" --load "$B"
bad ck_torch
head -c 5000 "$IT/mp_rank_00/model_optim_rng.pt" >"$TMP/part" && cp "$TMP/part" "$IT/mp_rank_00/model_optim_rng.pt"
expect_intact "is not a torch.save archive" pretrain "${A[@]}" --load "$B"
bad ck_torch
mkdir "$IT/mp_rank_01"
expect_intact "saved with tensor or pipeline parallelism (mp_rank_01)" pretrain "${A[@]}" --load "$B"

# The wrong directory, format or model.
bad ck_dist
expect_intact "one iteration's directory of a Megatron-LM torch_dist checkpoint" pretrain "${A[@]}" --load "$IT"
expect_intact "holds a torch_dist checkpoint but --ckpt-format is torch" \
  pretrain "${A[@]}" --load "$B" --ckpt-format torch
expect_error "--ckpt-format zarr" pretrain "${A[@]}" --ckpt-format zarr
expect_error "does not write them" pretrain "${A[@]}" --ckpt-format torch --save "$TMP/out"
expect_error "--async-save" pretrain "${A[@]}" --ckpt-format torch_dist --async-save --save "$TMP/out"
expect_intact "has shape" pretrain "${A[@]}" --load "$B" --ffn-hidden-size 96
expect_intact "use --from megatron-torch-dist" convert --from megatron-torch --input "$B" --output "$TMP/conv"
echo 3 >"$B/latest_checkpointed_iteration.txt"
expect_intact "iter_0000003" pretrain "${A[@]}" --load "$B"
finish
