#pragma once
// Mixture of experts: the shape and routing of Megatron Core's MoE layers, filled from Megatron's
// --num-experts / --moe-* flags (training/arguments_moe.cpp) or an HF config.json (Mixtral,
// Qwen2-MoE, Qwen3-MoE). A layer whose MLP is an MoE block holds a router, `num_experts` expert
// MLPs of moe_ffn_hidden_size (split over expert-parallel ranks) and optionally a shared expert.
#include <cstdint>
#include <string>
#include <vector>

namespace mt::model {

struct MoEConfig {
  int64_t num_experts = 0;          // --num-experts; 0: no MoE layers (dense model)
  int64_t moe_ffn_hidden_size = 0;  // --moe-ffn-hidden-size; 0 -> ffn_hidden_size
  // --moe-layer-freq: per layer, whether its MLP is an MoE block. Empty: every layer. An integer
  // N means one MoE layer every N (layers 0, N, 2N, ...), as Megatron; a pattern list is taken as
  // given (its length must be num_layers).
  std::vector<bool> layer_pattern;

  // Router (Megatron's TopKRouter).
  int64_t topk = 2;                      // --moe-router-topk
  std::string score_function = "softmax";  // --moe-router-score-function softmax|sigmoid
  bool pre_softmax = false;              // --moe-router-pre-softmax: softmax over all experts, then top-k
  double topk_scaling_factor = 0;        // --moe-router-topk-scaling-factor; 0: none
  std::string router_dtype = "fp32";     // --moe-router-dtype: routing always runs in fp32 here
  int64_t num_groups = 0;                // --moe-router-num-groups (device-limited routing); 0: off
  int64_t group_topk = 0;                // --moe-router-group-topk
  // Load balancing: aux_loss | seq_aux_loss | sinkhorn | none.
  std::string load_balancing_type = "aux_loss";
  double aux_loss_coeff = 0;             // --moe-aux-loss-coeff
  double z_loss_coeff = 0;               // --moe-z-loss-coeff; 0: off
  bool enable_expert_bias = false;       // --moe-router-enable-expert-bias (DeepSeek-V3, sigmoid)
  double bias_update_rate = 1e-3;        // --moe-router-bias-update-rate

  // Shared expert (always on, beside the routed ones): 0 = none.
  int64_t shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size
  bool shared_expert_gate = false;              // --moe-shared-expert-gate: y_shared *= sigmoid(x . g) (Qwen2-MoE)
  // --moe-shared-expert-overlap: the shared expert's forward (backward) runs while the dispatch's
  // (combine's backward) token exchange is in flight. Same results: its output is added where it
  // always is.
  bool shared_expert_overlap = false;

  // Token dropping (dropless when capacity_factor <= 0).
  double capacity_factor = 0;          // --moe-expert-capacity-factor
  bool pad_to_capacity = false;        // --moe-pad-expert-input-to-capacity
  std::string drop_policy = "probs";   // --moe-token-drop-policy probs|position

  // Dispatch and kernels.
  std::string token_dispatcher = "allgather";  // --moe-token-dispatcher-type allgather|alltoall
  bool grouped_gemm = false;                   // --moe-grouped-gemm: the GPU runs the experts' GEMMs on several streams
  bool permute_fusion = false;                 // --moe-permute-fusion (accepted; permutation is one kernel)

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return enabled() && (layer_pattern.empty() || layer_pattern[static_cast<size_t>(layer)]);
  }
  int64_t num_moe_layers(int64_t num_layers) const {
    int64_t n = 0;
    for (int64_t l = 0; l < num_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
    return n;
  }
  bool uses_aux_loss() const { return load_balancing_type == "aux_loss" || load_balancing_type == "seq_aux_loss"; }
};

}  // namespace mt::model
