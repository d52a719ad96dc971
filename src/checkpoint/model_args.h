#pragma once
// The checkpoint schema of a run's model and tokenizer arguments (state.json "args", as
// Megatron stores its args): what generate, logits, convert and a resume need to rebuild the
// model a checkpoint was written by. Fields added later have defaults, so older checkpoints load
// (the MoE fields, under Megatron's argument names, are written for MoE models only: a
// checkpoint without num_experts is dense).
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "model/config.h"

namespace mt::checkpoint {

nlohmann::json model_args_to_json(const model::TransformerConfig& m, const data::TokenizerOptions& tokenizer);
// Fills the model shape and the tokenizer from a state.json "args"; mt::Error when fields are missing.
void model_args_from_json(const nlohmann::json& j, model::TransformerConfig& m, data::TokenizerOptions& tokenizer);

}  // namespace mt::checkpoint
