#include "training/flops.h"

namespace mt {

// Megatron's num_floating_point_operations (training.py, transformer_flops) for a GPT model:
// 3 (forward, dgrad, wgrad) x 2 (multiply-add) FLOPs per weight and token, causal attention
// scores counted half. MoE layers (per --moe-layer-freq) count the top-k routed experts of
// moe_ffn and the shared expert, dense layers their ffn; like Megatron, the router's [h, E]
// GEMM is left out (under 0.2% of an MoE layer's FLOPs for any real shape).
double flops_per_iteration(const model::TransformerConfig& c, int64_t batch, int64_t seq) {
  const double T = static_cast<double>(batch) * static_cast<double>(seq);
  const double S2 = static_cast<double>(batch) * static_cast<double>(seq) * static_cast<double>(seq);
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.ffn_hidden_size);
  const double L = static_cast<double>(c.num_layers), V = static_cast<double>(c.vocab_size);
  const double n = static_cast<double>(c.num_attention_heads), d = static_cast<double>(c.kv_channels);
  const double g = static_cast<double>(c.num_query_groups), E = c.swiglu ? 3.0 : 2.0;
  const double moe_layers = static_cast<double>(c.moe.num_moe_layers(c.num_layers));
  double mlp = f * (L - moe_layers);  // hidden width summed over the layers' MLPs
  if (c.moe.enabled())
    mlp += (static_cast<double>(c.moe.moe_ffn_hidden_size) * static_cast<double>(c.moe.topk) +
            static_cast<double>(c.moe.shared_expert_intermediate_size)) *
           moe_layers;
  return T * (6 * h * mlp * E + 6 * (h * (n * d + 2 * d * g) + n * d * h) * L + 6 * h * V) + S2 * 6 * n * d * L;
}

}  // namespace mt
