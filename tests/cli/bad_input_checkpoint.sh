#!/usr/bin/env bash
# Bad checkpoints, safetensors files and HuggingFace configs (issue #27): one clear line naming the
# file and the key, a non-zero exit, never a crash or a hang; what the command only reads stays
# as it was (checksums before and after), and nothing is written through a planted link.
set -u
MEGATRON=$1
SRC=$2
source "$SRC/tests/cli/lib/expect.bash"
BASE=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --micro-batch-size 2
      --train-iters 2 --lr 1e-3 --mock-data --vocab-size 64 --eval-iters 0 --no-progress-bar)
HF=$SRC/tests/checkpoint/fixtures/llama2

CK=$TMP/ck
if ! "$MEGATRON" pretrain "${BASE[@]}" --save "$CK" >"$TMP/log" 2>&1; then
  echo "FAIL: could not make a checkpoint"; cat "$TMP/log"; exit 1
fi
CK_SUM=$(tree_sum "$CK")

# bad: a fresh copy of the checkpoint at $TMP/bad to break; resume: train on from it.
bad() { rm -rf "$TMP/bad"; cp -a "$CK" "$TMP/bad"; }
B=$TMP/bad
IT=$B/iter_0000002
RESUME=(pretrain "${BASE[@]}" --train-iters 4 --load "$B")
# expect_intact "needle" args...: the error, and the broken copy exactly as it was.
expect_intact() {
  local before; before=$(tree_sum "$B")
  expect_error "$@"
  check "the checkpoint at $B is unchanged after: $*" [ "$(tree_sum "$B")" = "$before" ]
}

# 1. A piece whose box has another rank than its tensor (was SIGSEGV).
bad; sed -i '0,/"offset":\[0,0\]/s//"offset":[]/' "$IT/metadata.json"
expect_intact "offset must hold 2 integers" "${RESUME[@]}"
bad; sed -i '0,/"extent":\[128,32\]/s//"extent":[129,32]/' "$IT/metadata.json"
expect_intact "reaches past the tensor's dimension 0 of 128" "${RESUME[@]}"
bad; sed -i '0,/"flat":\[0,[0-9]*\]/s//"flat":[0,99999999]/' "$IT/metadata.json"
expect_intact "flat[1] must be an integer between 0 and" "${RESUME[@]}"

# 2. Directories, FIFOs and devices where files belong (were SIGABRT or a hang).
bad; rm "$B/latest_checkpointed_iteration.txt"; mkdir "$B/latest_checkpointed_iteration.txt"
expect_intact "latest_checkpointed_iteration.txt' is a directory, expected a file" "${RESUME[@]}"
bad; rm "$B/latest_checkpointed_iteration.txt"; mkfifo "$B/latest_checkpointed_iteration.txt"
expect_error "latest_checkpointed_iteration.txt' is not a regular file" "${RESUME[@]}"
bad; rm "$IT/model.safetensors"; mkdir "$IT/model.safetensors"
expect_intact "model.safetensors' is a directory, expected a file" "${RESUME[@]}"
bad; rm "$IT/state.json"; mkdir "$IT/state.json"
expect_intact "state.json' is a directory, expected a file" "${RESUME[@]}"
bad; rm "$IT/model.safetensors"; ln -s /dev/zero "$IT/model.safetensors"
expect_intact "model.safetensors' is not a regular file" "${RESUME[@]}"
bad; rm "$IT/optimizer.safetensors"; mkfifo "$IT/optimizer.safetensors"
expect_error "optimizer.safetensors' is not a regular file" "${RESUME[@]}"

# 6. File names in metadata.json stay inside the checkpoint (/dev/zero hung; ../ read elsewhere).
bad; sed -i 's#"model.safetensors"#"/dev/zero"#g' "$IT/metadata.json"
expect_intact "file name '/dev/zero' points outside the checkpoint directory" "${RESUME[@]}"
cp "$IT/model.safetensors" "$B/outside.safetensors"
sed -i 's#"/dev/zero"#"../outside.safetensors"#g' "$IT/metadata.json"
expect_intact "file name '../outside.safetensors' points outside the checkpoint directory" "${RESUME[@]}"

# 9. state.json: the iteration must be a count that agrees with the tracker. Its size and CRC in
# metadata.json are made to match the edit, as a careless or hostile writer would.
state_edit() {  # state_edit 'sed expression'
  sed -i "$1" "$IT/state.json"
  local crc bytes
  crc=$(gzip -c "$IT/state.json" | tail -c8 | od -An -tu4 -N4 | tr -d ' ')  # gzip's trailer is the CRC32
  bytes=$(stat -c %s "$IT/state.json")
  sed -i -E "s/\"state.json\":\{\"bytes\":[0-9]+,\"crc32\":[0-9]+\}/\"state.json\":{\"bytes\":$bytes,\"crc32\":$crc}/" \
    "$IT/metadata.json"
}
bad; state_edit 's/"consumed_train_samples": [0-9]*,/"consumed_train_samples": 4,/'
check "a state.json edit with its CRC updated loads" "$MEGATRON" "${RESUME[@]}" >"$TMP/out" 2>&1
bad; state_edit 's/"iteration": 2,/"iteration": -5,/'
expect_intact "state.json': iteration must be an integer between 0 and 1000000000000, got -5" "${RESUME[@]}"
bad; state_edit 's/"iteration": 2,/"iteration": 1e15,/'
expect_intact "state.json': iteration must be an integer between 0 and 1000000000000, got 1e+15" "${RESUME[@]}"
bad; state_edit 's/"iteration": 2,/"iteration": 7,/'
expect_intact "iteration is 7, but the checkpoint directory is iteration 2" "${RESUME[@]}"
bad; state_edit 's/"consumed_train_samples": [0-9]*,/"consumed_train_samples": 2.5,/'
expect_intact "consumed_train_samples must be an integer, got 2.5" "${RESUME[@]}"
bad
expect_intact "the checkpoint is at iteration 2, past the 1 iterations this run trains" \
  pretrain "${BASE[@]}" --train-iters 1 --load "$B"

# 8. Megatron's "release" tracker: the weights of SAVE/release/, training from iteration 0.
bad; mv "$IT" "$B/release"; echo release >"$B/latest_checkpointed_iteration.txt"
check "pretrain --load of a release checkpoint" "$MEGATRON" pretrain "${BASE[@]}" --load "$B" \
  --log-interval 1 >"$TMP/out" 2>&1
check "release/ is loaded as weights from iteration 0" grep -q "loaded weights from $B release/" "$TMP/out"
check "release/ trains iterations 1 and 2" grep -q "iteration        2/       2" "$TMP/out"
check "convert --to hf of a release checkpoint" "$MEGATRON" convert --from megatron --input "$B" \
  --output "$TMP/hf_release" >"$TMP/out" 2>&1
check "convert names the release checkpoint" grep -q "exported the release checkpoint" "$TMP/out"
rm -rf "$B/release"
expect_intact "checkpoint directory '$B/release' is missing (the tracker points at the release checkpoint)" \
  "${RESUME[@]}"

# 4. convert --from hf into an existing checkpoint (rewound its tracker from 2 to 0).
expect_error "--output '$CK' exists and is not empty" convert --from hf --input "$HF" --output "$CK"
echo x >"$TMP/afile"
expect_error "--output '$TMP/afile' exists and is not a directory" convert --from hf --input "$HF" --output "$TMP/afile"
check "the checkpoint is unchanged" [ "$(tree_sum "$CK")" = "$CK_SUM" ]

# 5. A link planted at the tracker's temporary name is replaced, never written through.
echo "precious" >"$TMP/victim"
VICTIM=$(sha256sum <"$TMP/victim")
bad; ln -s "$TMP/victim" "$B/latest_checkpointed_iteration.txt.tmp"
ln -s "$TMP/victim" "$B/iter_0000004.tmp"
check "resume and save beside planted links" "$MEGATRON" pretrain "${BASE[@]}" --train-iters 4 --load "$B" \
  --save "$B" >"$TMP/out" 2>&1
check "the link's target is untouched" [ "$(sha256sum <"$TMP/victim")" = "$VICTIM" ]
check "the tracker moved to 4" [ "$(cat "$B/latest_checkpointed_iteration.txt")" = 4 ]
check "the tracker is a regular file" test -f "$B/latest_checkpointed_iteration.txt" -a ! -L "$B/latest_checkpointed_iteration.txt"

# 3. HF config.json: every field typed and ranged, named with the file.
hf_with() {  # hf_with 'sed expression': a copy of the fixture with config.json edited
  rm -rf "$TMP/hf"; cp -r "$HF" "$TMP/hf"; sed -i "$1" "$TMP/hf/config.json"
}
HFC=(convert --from hf --input "$TMP/hf" --output "$TMP/hf_out")
hf_with 's/"num_attention_heads": 4/"num_attention_heads": 0/'
expect_error "hf/config.json: num_attention_heads must be an integer between 1 and" "${HFC[@]}"
hf_with 's/"num_hidden_layers": 2/"num_hidden_layers": 1e9/'
expect_error "hf/config.json: num_hidden_layers must be an integer between 1 and" "${HFC[@]}"
hf_with 's/"intermediate_size": 64/"intermediate_size": -1/'
expect_error "hf/config.json: intermediate_size must be an integer between 1 and" "${HFC[@]}"
hf_with 's/"hidden_size": 32/"hidden_size": 64.5/'
expect_error "hf/config.json: hidden_size must be an integer, got 64.5" "${HFC[@]}"
hf_with 's/"num_key_value_heads": 4/"num_key_value_heads": 3/'
expect_error "num_attention_heads (4) must be divisible by num_key_value_heads (3)" "${HFC[@]}"
hf_with 's/"head_dim": 8/"head_dim": null/; s/"num_attention_heads": 4/"num_attention_heads": 5/; s/"num_key_value_heads": 4/"num_key_value_heads": 5/'
expect_error "hidden_size (32) must be divisible by num_attention_heads (5), or set head_dim" "${HFC[@]}"
hf_with 's/"rms_norm_eps": 1e-05/"rms_norm_eps": 0/'
expect_error "hf/config.json: rms_norm_eps must be positive" "${HFC[@]}"
hf_with 's/"tie_word_embeddings": false/"tie_word_embeddings": 0/'
expect_error "hf/config.json: tie_word_embeddings must be true or false, got 0" "${HFC[@]}"
hf_with 's/"vocab_size": 100/"vocab_size": "100"/'
expect_error "hf/config.json: vocab_size must be an integer, got \"100\"" "${HFC[@]}"
hf_with 's/"rope_theta": 10000.0/"rope_theta": -1/'
expect_error "hf/config.json: rope_parameters: rope_theta must be" "${HFC[@]}"
check "no output was made from a bad config" [ ! -e "$TMP/hf_out" ]

# 10, 11. HF safetensors: integer dtypes are not floats; tensors may not share bytes.
hf_with 's/x/x/'
perl -0777 -pi -e 's/"dtype":"F32"/"dtype":"I32"/' "$TMP/hf/model.safetensors"
expect_error "tensor 'lm_head.weight' in '$TMP/hf/model.safetensors' is stored as I32" "${HFC[@]}"
hf_with 's/x/x/'
perl -0777 -pi -e 's/"data_offsets":\[12800,25600\]/"data_offsets":[0,    12800]/' "$TMP/hf/model.safetensors"
expect_error "overlaps the bytes of another tensor" "${HFC[@]}"
hf_with 's/x/x/'
printf '\377\377\377\377\000\000\000\000' | dd of="$TMP/hf/model.safetensors" conv=notrunc status=none
expect_error "has a corrupt safetensors header (length 4294967295 of a" "${HFC[@]}"
hf_with 's/x/x/'
head -c 8 /dev/zero >>"$TMP/hf/model.safetensors"
expect_error "8 bytes after the last tensor belong to no tensor" "${HFC[@]}"

check "the original checkpoint is unchanged" [ "$(tree_sum "$CK")" = "$CK_SUM" ]
finish
