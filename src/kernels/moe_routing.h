#pragma once
// How an MoE router turns logits [T, E] into each token's experts and weights, shared by the CPU
// and CUDA kernels and the model (Megatron Core's TopKRouter, facts from moe_utils.py):
//   softmax, no pre-softmax:  top-k of the logits, probs = softmax over those k logits
//   softmax, pre-softmax:     probs = softmax over all E, then its top-k (not renormalised)
//   sigmoid:                  s = sigmoid(logits); top-k of s (+ expert_bias: DeepSeek-V3's
//                             loss-free balancing, which moves the choice but not the weights);
//                             probs = s / (sum of the k + 1e-20) when k > 1
//   sinkhorn (training):      top-k of sinkhorn(logits); probs = sigmoid (k = 1) or softmax over
//                             all E (k > 1) at those experts
// Group-limited routing (num_groups > 0): the experts form num_groups equal groups; each token
// keeps the group_topk groups whose top-(k / group_topk) scores sum highest and picks its k
// experts among them. probs are then multiplied by scaling (when > 0). Ties pick the lower index.
//
// The load-balancing terms read the "aux scores": softmax over all E, or sigmoid normalised over
// all E, with a plain top-k of them (no groups, no bias) as the routing map they count.
#include <cstdint>

namespace mt::ops {

struct RouterSpec {
  enum class Score : uint8_t { Softmax, Sigmoid };
  int64_t num_experts = 0, topk = 1;
  Score score = Score::Softmax;
  bool pre_softmax = false;
  float scaling = 0.f;  // 0: none
  int64_t num_groups = 0, group_topk = 0;
  bool sinkhorn = false;  // training with --moe-router-load-balancing-type sinkhorn
  // Sinkhorn's iteration stops at this change of its column scale (Megatron's tol), and in any
  // case after max_sinkhorn_iters: a bound Megatron's loop does not have.
  float sinkhorn_tol = 1e-4f;
  int64_t max_sinkhorn_iters = 1000;
};

}  // namespace mt::ops
