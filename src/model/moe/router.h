#pragma once
// Megatron Core's TopKRouter: logits = x W^T (W [E, h]), then the routing rules of
// kernels/moe_routing.h, optional token dropping, and the load-balancing terms. The auxiliary
// losses never enter the forward value: like Megatron's MoEAuxLossAutoScaler they only add their
// gradient to the logits' in backward, scaled by PassContext::moe_aux_grad_scale.
#include <vector>

#include "kernels/host_mirror.h"
#include "kernels/moe_routing.h"
#include "model/layers.h"

namespace mt::model {

// What the MoE layers of one pass report for the log line, summed over micro-batches and layers
// (Megatron's aux-loss tracker records loss / coeff per layer): the step runner averages them.
struct MoELossSums {
  double load_balancing = 0;      // aux_loss / coeff (this rank's share; summed over TP)
  double seq_load_balancing = 0;  // seq_aux_loss / coeff
  double z_loss = 0;              // z_loss / coeff (averaged over TP)
};

struct TopKRouter {
  MoEConfig moe;
  int64_t layer = 0;  // global layer index
  Param* weight = nullptr;       // [E, h]
  Param* expert_bias = nullptr;  // [E], fp32, moved by the step runner (update_expert_bias), not the optimizer
  const TensorParallel* tp = nullptr;
  // Tokens each expert received in this step's training forwards (the dispatch map, after
  // dropping), for the expert-bias update.
  mutable std::vector<double> tokens_per_expert;
  // Where forward's load-balancing statistics reach the host (one layer's forward at a time:
  // started in forward, read in finish_forward).
  mutable ops::HostMirror stats_mirror;

  struct Saved {
    Tensor x, logits;       // router input; f32 [T, E]
    Tensor selected, probs;  // I32 / f32 [T, E]
    Tensor aux_coef;        // f32 [B, E]: d(aux losses)/d(aux score), times the aux grad scale; empty: no
                            // load-balancing term this pass (zeros: the z-loss alone)
    float z_coef = 0.f;     // d(z-loss)/d(sum of lse^2), times the aux grad scale
    int64_t B = 0;
    // The load-balancing statistics forward launched (moe_aux_stats), read by finish_forward.
    Tensor stat_sums, stat_counts, stat_z;
  };

  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t layer_index,
             const TensorParallel* tp);
  ops::RouterSpec spec(bool training) const;
  // probs [T, E] (0 where not routed) and the dispatch map I32 [T, E]. T = S * B tokens in rows
  // t = s*B + b (this rank's sequence shard under SP: S is then the local length).
  void forward(const Tensor& x, int64_t B, Saved& s, PassContext& ctx, Tensor& probs, Tensor& map) const;
  // After the layer has read its dispatch counts (the one wait for the device): the
  // load-balancing losses from the statistics forward launched (already computed by then, so
  // reading them costs no second wait), and the counts for the expert-bias update.
  void finish_forward(const std::vector<int32_t>& counts, Saved& s, PassContext& ctx) const;
  // dprobs [T, E] -> dx [T, h]; adds the router weight's gradient.
  Tensor backward(const Tensor& dprobs, Saved& s, PassContext& ctx) const;
  // DeepSeek-V3's loss-free balancing after a step: bias += rate * sign(mean - count) from the
  // step's counts summed over `reduce` (TP x DP x CP); clears the counts.
  void update_expert_bias(const std::function<void(std::vector<double>&)>& reduce);

 private:
  void load_balancing(Saved& s, PassContext& ctx) const;
};

}  // namespace mt::model
