#pragma once
// HuggingFace tensors <-> Megatron-core tensors (DESIGN.md's Llama layouts):
//   q_proj, k_proj, v_proj  -> linear_qkv, packed per query group: that group's q heads, its k
//                              head, its v head (weights and Qwen2's biases alike)
//   gate_proj, up_proj      -> linear_fc1 = [gate; up] (and so for every expert: Mixtral's w1, w3;
//                              the router is Mixtral's block_sparse_moe.gate / Qwen's mlp.gate)
//   embed_tokens / lm_head  -> word embeddings / output layer, padded with zero rows to the
//                              padded vocabulary (and cut back on export)
//   GPT-2's Conv1D weights  -> transposed ([in, out] -> [out, in]); c_attn's [q | k | v] columns
//                              regrouped per head
// RoPE is rotate-half on both sides, so q and k need no permutation.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/hf_config.h"
#include "checkpoint/safetensors.h"
#include "core/tensor.h"

namespace mt::checkpoint {

// The tensors of a HuggingFace model directory: model.safetensors, or the shards listed in
// model.safetensors.index.json. Files are mapped; each tensor is converted to fp32 on read.
class HfTensors {
 public:
  explicit HfTensors(const std::string& dir);
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // Throws naming the tensor and the directory when it is missing or has another shape.
  std::vector<float> read(const std::string& name, const Shape& expected);
  // Tensors never read (after an import: weights the model has no place for).
  std::vector<std::string> unused() const;

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
  std::map<std::string, bool> used_;
};

// One Megatron tensor and the HF tensors it is made of.
struct HfRule {
  // Norm: a norm's weight, copied, minus 1 on import and plus 1 on export where the model stores
  // it zero-centred (--apply-layernorm-1p).
  enum Kind { Copy, Norm, Transpose, Vocab, Fc1, Qkv, Gpt2Qkv } kind = Copy;
  std::string megatron;
  std::vector<std::string> hf;
};

// Every rule of the architecture (all layers), in Megatron registration order. `hf_prefix` is
// GPT-2's "transformer." when the checkpoint uses it.
std::vector<HfRule> hf_rules(const HfSpec& spec, const std::string& gpt2_prefix = "transformer.");
// GPT-2 checkpoints come with or without the "transformer." prefix: the one `t` uses.
std::string gpt2_prefix(const HfTensors& t);

// The full Megatron tensor of `rule` (shape `shape`, vocabulary rows padded) from HF tensors.
std::vector<float> import_tensor(const HfSpec& spec, const HfRule& rule, HfTensors& src, const Shape& shape);

struct HfTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};
// The HF tensors of `rule` from the full Megatron tensor `m` of shape `shape`.
std::vector<HfTensor> export_tensor(const HfSpec& spec, const HfRule& rule, const std::vector<float>& m,
                                    const Shape& shape);

}  // namespace mt::checkpoint
