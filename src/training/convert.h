#pragma once
// HuggingFace configs as pretrain arguments: `--load HF_DIR` takes the model's shape from its
// config.json, and `megatron convert` writes it into checkpoints.
#include "checkpoint/hf_config.h"
#include "training/arguments.h"

namespace mt {

// Sets the model-shape arguments from `spec`. A flag the user gave (a.given) with another value
// is an error naming the flag and `where` (the config file).
void apply_hf_config(Arguments& a, const checkpoint::HfSpec& spec, const std::string& where);
// After validate_args: the embedding has the HF vocabulary's rows (padded as Megatron pads),
// whatever the tokenizer's size; a tokenizer larger than it is an error.
void apply_hf_vocab(Arguments& a, const checkpoint::HfSpec& spec, int64_t tokenizer_vocab, const std::string& where);

}  // namespace mt
