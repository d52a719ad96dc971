#pragma once
// Megatron's --moe-layer-freq: an integer N (one MoE layer every N layers: layers 0, N, 2N, ...)
// or a Python list expression giving each layer, 1 = MoE and 0 = dense, such as
// "([1]*3+[0]*1)*3" or "[0]+[1]*23". Megatron evals the expression; here a small parser takes
// exactly the subset such patterns use (non-negative integers, lists, +, * and parentheses), so
// a flag value never runs code and every mistake is one line naming the position.
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct MoELayerFreq {
  int64_t every = 1;          // the integer form (used when `pattern` is empty)
  std::vector<bool> pattern;  // the list form, one entry per layer
};

// Parses `text` (the value of `flag`); throws mt::Error "<flag>: ... at position P in '<text>'".
// Lists are bounded by model::limits::kLayers entries, expressions by a nesting depth.
MoELayerFreq parse_moe_layer_freq(const std::string& text, const std::string& flag = "--moe-layer-freq");

// The per-layer pattern for `num_layers` layers (empty: every layer is MoE); throws naming the
// flag when a list's length differs from num_layers.
std::vector<bool> moe_layer_pattern(const MoELayerFreq& f, int64_t num_layers,
                                    const std::string& flag = "--moe-layer-freq");

}  // namespace mt
