#pragma once
// The routed experts one rank holds: SwiGLU (or GELU) MLPs of moe_ffn_hidden_size, run over the
// dispatch rows of their tokens (expert-major: expert i's rows follow expert i-1's). Megatron's
// SequentialMLP names: mlp.experts.local_experts.<global expert>.linear_fc1 / linear_fc2.
#include <vector>

#include "model/layers.h"
#include "model/moe/token_dispatcher.h"

namespace mt::model {

struct GroupedExperts {
  int64_t first_expert = 0, num_local = 0;  // this rank holds experts [first, first + num_local)
  int64_t local_ffn = 0;                    // moe_ffn_hidden_size / ETP: this rank's columns
  bool swiglu = false, openai_gelu = false;
  bool recompute_act = false;  // --recompute-modules moe_act: backward recomputes the activation
  bool grouped_gemm = false;   // --moe-grouped-gemm: one grouped op for the local experts (streams on the GPU)
  std::vector<Linear> fc1, fc2;

  struct Saved {
    Tensor xp, h, a;              // dispatch rows, fc1 output, activation output (not kept under moe_act)
    std::vector<int64_t> counts;  // rows per local expert
  };
  // Under expert TP (ep->etp) each expert's fc1 is column- and fc2 row-split over the ETP group
  // (the dispatcher sums the partial outputs); the parameters are marked `expert`.
  void build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t first, int64_t count,
             const ExpertParallel* ep = nullptr);
  // xp [rows, h] with counts[i] rows for local expert i, in order -> [rows, h].
  Tensor forward(const Tensor& xp, const std::vector<int64_t>& counts, Saved& s, PassContext& ctx) const;
  Tensor backward(const Tensor& dyp, Saved& s, PassContext& ctx) const;
};

// The grouped experts' weight gradients that a backward left running on the GPU (experts.cpp):
// waited for (in stream order) and reported ready. Before anything reads them: the next MoE
// layer's backward and the end of each backward pass call it.
void join_deferred_expert_grads(PassContext& ctx);

}  // namespace mt::model
