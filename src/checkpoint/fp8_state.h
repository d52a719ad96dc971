#pragma once
// FP8 training's scaling state in checkpoints (model/fp8.h): per linear layer, keyed by its
// Megatron name with the global layer number (and global expert index), so it reshards with the
// parameters; every rank writes the states it holds and the merged metadata.json keeps one per
// name (TP ranks hold equal ones: their amaxes are reduced over TP). Floats are stored as their
// IEEE-754 bit patterns: exact, and an infinite amax in a history survives the round trip.
//   "fp8": {"decoder.layers.0.self_attention.linear_qkv":
//             {"input": {"scale": bits, "history": [bits, ...]}, "weight": {...}, "grad": {...}}, ...}
#include <string>

#include <nlohmann/json.hpp>

#include "model/fp8.h"

namespace mt::checkpoint {

// The store's state (copied from its device: a host wait, at save time only).
nlohmann::json fp8_state_to_json(model::Fp8Store& store);
// Loads the entries of `j` (untrusted: checked, errors name `where`) into the store's linears of
// the same names; linears without an entry keep their fresh state. Returns how many were loaded.
size_t fp8_state_from_json(model::Fp8Store& store, const nlohmann::json& j, const std::string& where);

}  // namespace mt::checkpoint
