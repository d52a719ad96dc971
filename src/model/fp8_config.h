#pragma once
// FP8 training settings (Megatron's TransformerConfig fp8 fields, flags in
// training/arguments_fp8.cpp). When enabled, the linear layers of transformer blocks (QKV,
// projection, fc1, fc2, MoE experts) quantize their GEMM inputs to FP8 with the recipe's scales;
// embedding, output layer, norms, attention and loss stay in the activation type.
#include <cstdint>

#include "core/fp8.h"

namespace mt::model {

// delayed: scale from an amax history of earlier quantizations (Transformer Engine's
// DelayedScaling). tensorwise: each tensor's own amax (current scaling). blockwise: DeepSeek-V3's
// 1x128 activation tiles and 128x128 weight blocks, each with its own power-of-two scale.
enum class Fp8Recipe : uint8_t { Delayed, Tensorwise, Blockwise };

struct Fp8Config {
  bool enabled = false;  // --fp8-format given
  bool hybrid = false;   // --fp8-format hybrid: E5M2 gradients, else E4M3 everywhere
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int64_t amax_history_len = 1;
  bool amax_max = false;  // --fp8-amax-compute-algo max (else most_recent)
  int64_t margin = 0;
  bool wgrad = true;  // --no-fp8-wgrad: the weight-gradient GEMM in the activation type
  bool param_gather = false;
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1, num_layers_at_end_in_bf16 = 1;

  Fp8Format forward_format() const { return Fp8Format::E4M3; }
  Fp8Format grad_format() const { return hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3; }
  // Whether transformer layer `layer` (0-based, of `num_layers`) runs its linears in FP8.
  bool layer_in_fp8(int64_t layer, int64_t num_layers) const {
    if (!enabled) return false;
    if (!first_last_layers_bf16) return true;
    return layer >= num_layers_at_start_in_bf16 && layer < num_layers - num_layers_at_end_in_bf16;
  }
};

inline const char* fp8_recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::Delayed ? "delayed" : r == Fp8Recipe::Tensorwise ? "tensorwise" : "blockwise";
}

}  // namespace mt::model
