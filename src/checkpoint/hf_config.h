#pragma once
// HuggingFace config.json <-> the model's TransformerConfig, for the architectures megatron.cpp
// converts: Llama (2, 3, 3.1 with rope_type llama3), Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm),
// GPT-2, and the mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE (hf_moe.h). Reads both the transformers 4.x style (rope_theta, rope_scaling, torch_dtype) that
// published checkpoints use and the 5.x style (rope_parameters, dtype); writes either.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "model/config.h"

namespace mt::checkpoint {

struct HfSpec {
  std::string arch;                  // llama | mistral | qwen2 | qwen3 | gpt2 | mixtral | qwen2_moe | qwen3_moe
  model::TransformerConfig cfg;      // shape and numerics; cfg.vocab_size is the HF (unpadded) vocabulary
  int64_t vocab_size = 0;            // HF vocabulary: rows of embed_tokens / wte
  DType dtype = DType::F32;          // torch_dtype / dtype: how the weights are stored
  bool v5_style = false;             // the config used rope_parameters / dtype
  nlohmann::json raw;                // the config.json as read (kept to write extra keys back)
};

// Reads DIR/config.json. Throws mt::Error naming the file and the key for anything it cannot
// represent (another architecture, an unsupported rope_scaling type, biases on some layers only).
HfSpec read_hf_config(const std::string& dir);
// Parses an already loaded config (as read_hf_config does); `where` names it in errors.
HfSpec parse_hf_config(const nlohmann::json& j, const std::string& where);

// The architecture a model config corresponds to, when none is recorded: GPT-2 for learned
// positions with LayerNorm, Qwen3 with q/k norm, Qwen2 with a QKV bias, otherwise Llama; a model
// with experts as infer_hf_moe_arch says.
std::string infer_hf_arch(const model::TransformerConfig& c);

// config.json for `spec` in the 4.x or 5.x style; `spec.raw`, when set, supplies the keys
// megatron.cpp does not model (token ids, ...).
nlohmann::json make_hf_config(const HfSpec& spec, bool v5_style);

// "float32" / "bfloat16" / "float16" <-> DType; throws naming `what` for other names.
DType hf_dtype(const std::string& name, const std::string& what);
std::string hf_dtype_name(DType t);

}  // namespace mt::checkpoint
