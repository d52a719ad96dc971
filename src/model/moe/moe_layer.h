#pragma once
// Megatron Core's MoELayer, the MLP of an MoE transformer layer:
//   router -> (token dropping) -> token dispatcher (dispatch plan, permute, and under expert
//   parallelism the exchange with the ranks holding the experts) -> local experts -> dispatcher
//   (back, unpermute weighted by the routing probs) [+ shared expert, optionally gated]
// The dispatch plan's per-expert token counts are the one value the host reads per layer
// (the experts' GEMM sizes): moe_dispatch_plan writes them on the device, the dispatcher copies
// them (token_dispatcher.h).
#include <memory>

#include "model/mlp.h"
#include "model/moe/experts.h"
#include "model/moe/router.h"
#include "model/moe/token_dispatcher.h"

namespace mt::model {

struct MoELayer {
  TransformerConfig cfg;  // the whole model's shape
  TopKRouter router;
  GroupedExperts experts;  // this rank's experts (all of them without expert parallelism)
  std::shared_ptr<const TokenDispatcher> dispatcher;
  bool has_shared = false;
  MLP shared;                    // mlp.shared_experts (ffn = moe_shared_expert_intermediate_size)
  Param* shared_gate = nullptr;  // mlp.shared_experts.gate_weight [1, h] (--moe-shared-expert-gate)

  struct Saved {
    TopKRouter::Saved router;
    TokenDispatcher::Saved dispatch;
    GroupedExperts::Saved experts;
    MLP::Saved shared;
    Tensor x, shared_y, gate;  // gate logits [T, 1]
  };
  // `ep`: where the experts live (null: all here). Under TP the layer sees sequence shards
  // (sequence parallelism): the router and dispatcher work on this rank's own tokens.
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t layer_index,
             const TensorParallel* tp, const ExpertParallel* ep = nullptr);
  // x [T, h] with T = S*B rows (t = s*B + b) -> [T, h].
  Tensor forward(const Tensor& x, int64_t B, Saved& s, PassContext& ctx) const;
  Tensor backward(const Tensor& dy, Saved& s, PassContext& ctx) const;

 private:
  // The shared expert (and its gate) alone: its output, and the gradient of x through it.
  Tensor shared_expert_forward(const Tensor& x, Saved& s, PassContext& ctx) const;
  Tensor shared_expert_backward(const Tensor& dy, Saved& s, PassContext& ctx) const;
};

}  // namespace mt::model
