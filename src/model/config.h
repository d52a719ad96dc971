#pragma once
// TransformerConfig: the model's shape and numerics, filled from Megatron-LM's flags by the
// training layer. validate() turns impossible combinations into one clear error.
#include <cstdint>
#include <string>
#include <vector>

#include "model/fp8_config.h"
#include "model/moe/moe_config.h"

namespace mt::model {

// Upper bounds on a model's shape, whatever its source (flags, a checkpoint's state.json, an HF
// config.json). Far above any real model (Llama 3.1 405B: 126 layers, hidden 16384, FFN 53248,
// 128 heads of 128, 131072 positions), low enough that every size the engine derives from them
// is checked rather than wrapped: finalize() also checks the products (BLAS dimensions within
// int32, the parameter count within int64) before anything is allocated.
namespace limits {
inline constexpr int64_t kLayers = int64_t{1} << 16;
inline constexpr int64_t kHidden = int64_t{1} << 20;
inline constexpr int64_t kFfnHidden = int64_t{1} << 22;
inline constexpr int64_t kHeads = int64_t{1} << 16;
inline constexpr int64_t kHeadDim = int64_t{1} << 16;
inline constexpr int64_t kSeqLength = int64_t{1} << 24;
inline constexpr int64_t kVocab = (int64_t{1} << 31) - 1;  // token ids are int32
inline constexpr int64_t kBlasDim = (int64_t{1} << 31) - 1;  // one GEMM dimension (BLAS int)
inline constexpr int64_t kExperts = int64_t{1} << 16;  // routed experts per MoE layer (DeepSeek-V3: 256)
}  // namespace limits

// The half precision the CPU engine emulates (compute copy of the params and stored activations
// rounded to it); fp32 main params and grads either way.
enum class Half : uint8_t { None, BF16, FP16 };

struct TransformerConfig {
  int64_t num_layers = 2;
  int64_t hidden_size = 64;
  int64_t ffn_hidden_size = 0;       // default 4*h, or Megatron's SwiGLU default (see finalize)
  int64_t num_attention_heads = 4;
  int64_t num_query_groups = 0;      // 0 -> = heads (no GQA)
  int64_t kv_channels = 0;           // head dim; 0 -> hidden / heads
  int64_t seq_length = 128;
  int64_t max_position_embeddings = 0;  // learned positions; 0 -> seq_length
  int64_t vocab_size = 0;            // padded vocabulary (rows of the embedding)
  int64_t orig_vocab_size = 0;       // tokenizer vocabulary before padding
  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  float norm_epsilon = 1e-5f;
  bool swiglu = false;
  bool openai_gelu = false;          // tanh-approximate GELU
  std::string position_embedding_type = "learned_absolute";  // learned_absolute | rope | none
  double rotary_base = 10000.0;
  float rotary_percent = 1.0f;
  // Llama 3.1's RoPE frequency scaling (--use-rope-scaling): low frequencies are divided by
  // `factor`, high ones kept, the band between blended (HF rope_type "llama3").
  bool rope_scaling = false;
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  bool qk_layernorm = false;         // --qk-layernorm: a norm over each head's q and k (Qwen3)
  // --apply-layernorm-1p (Megatron's layernorm_zero_centered_gamma): every norm stores its weight
  // as w - 1, initialised to zero, and scales by (1 + w).
  bool layernorm_zero_centered_gamma = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = false;         // true when add_bias_linear (Megatron), or --add-qkv-bias
  bool untie_embeddings_and_output_weights = false;
  float init_method_std = 0.02f;
  float attention_dropout = 0.1f;
  float hidden_dropout = 0.1f;
  bool bf16 = false;                 // bf16 model params/activations, fp32 main params & grads
  bool fp16 = false;                 // fp16 likewise (the trainer adds loss scaling)
  uint64_t seed = 1234;
  // Activation recomputation (Megatron's --recompute-*; validated by the training layer).
  // "full": layers keep only their input and re-run forward in backward, grouped per model
  // chunk by `recompute_method` ("uniform": groups of N layers; "block": the first N layers,
  // one at a time). "selective": only the attention core is re-run in backward.
  std::string recompute_granularity;  // "" (off) | full | selective
  std::string recompute_method;       // "" | uniform | block (full only)
  int64_t recompute_num_layers = 0;   // N (full only)
  // --distribute-saved-activations (full only, TP > 1, no SP): a group keeps 1/TP of its input
  // per TP rank and all-gathers it before the re-run (Megatron's CheckpointFunction).
  bool distribute_saved_activations = false;
  // Selective recomputation's modules (--recompute-modules): core_attn (the attention core),
  // moe_act (the routed experts' activation), moe (the whole MoE layer: it keeps its input only).
  std::vector<std::string> recompute_modules = {"core_attn"};
  MoEConfig moe;                      // mixture of experts (model/moe/); num_experts 0: dense
  Fp8Config fp8;                      // FP8 GEMMs in the transformer layers (model/fp8_config.h)

  int64_t head_dim() const { return kv_channels; }
  int64_t groups() const { return num_query_groups; }
  int64_t q_per_group() const { return num_attention_heads / num_query_groups; }
  int64_t qkv_out() const { return num_query_groups * (q_per_group() + 2) * kv_channels; }
  int64_t fc1_out() const { return swiglu ? 2 * ffn_hidden_size : ffn_hidden_size; }
  int64_t rotary_dim() const;
  Half half() const { return bf16 ? Half::BF16 : fp16 ? Half::FP16 : Half::None; }
  bool rope() const { return position_embedding_type == "rope"; }
  bool rmsnorm() const { return normalization == "RMSNorm"; }
  bool recompute_full() const { return recompute_granularity == "full"; }
  bool recompute_selective() const { return recompute_granularity == "selective"; }
  bool recomputes(const std::string& module) const {
    if (!recompute_selective()) return false;
    for (const auto& m : recompute_modules)
      if (m == module) return true;
    return false;
  }

  // Fills defaults that depend on other fields, then validates; throws mt::Error naming the flag.
  // Sizes are range-checked before any default is derived from them.
  void finalize();
  // Overflow-checked (throws mt::Error naming the shape flags); call after finalize().
  int64_t num_parameters() const;
  // The parameters one token uses: as num_parameters(), but of each MoE layer's routed experts
  // only the top-k (router, shared expert and dense layers in full). Equal for a dense model.
  int64_t num_active_parameters() const;
};

// Megatron's vocab padding: round up to a multiple of divisible_by * tp.
int64_t padded_vocab_size(int64_t orig, int64_t divisible_by, int64_t tp);

}  // namespace mt::model
