#pragma once
// Per-micro-batch state shared by the modules of one forward/backward pass: whether we are
// training (dropout on), where dropout draws its Philox numbers, and op timers.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/philox.h"
#include "model/op_times.h"

namespace mt::model {

struct Param;
struct RecomputeGroup;  // transformer_layer.cpp
struct SequenceLayout;  // sequence_layout.h
struct MoELossSums;     // moe/router.h

// Callbacks the data-parallel layer hangs on a pass: a parameter is about to be read (its
// all-gather under --overlap-param-gather must be done), and a parameter's gradient for this
// pass is complete (its bucket may start reducing under --overlap-grad-reduce).
class ParamHooks {
 public:
  virtual ~ParamHooks() = default;
  virtual void before_use(const Param& p) = 0;
  virtual void grad_ready(const Param& p) = 0;
};

struct PassContext {
  bool training = true;
  // The loss_grad_scale the backward of this forward will be given, where the caller knows it
  // (the pipeline's training passes): the head then forms the logits' gradient in its forward,
  // in the same pass over the logits as the loss (GPU, no TP). Unset: the backward forms it.
  std::optional<float> loss_grad_scale;
  RngState* rng = nullptr;  // dropout stream; offsets are drawn in a fixed order per pass
  // Megatron's model-parallel RNG: dropout inside tensor-parallel regions (attention
  // probabilities, and everything on sequence shards under --sequence-parallel) draws from a
  // stream seeded per TP rank, so ranks holding different heads or rows use different masks.
  // Null without TP: those dropouts use `rng`.
  RngState* tp_rng = nullptr;
  OpTimes* times = nullptr;
  ParamHooks* hooks = nullptr;
  // Mixture of experts. The weight of a micro-batch's auxiliary losses in the gradient (Megatron's
  // MoEAuxLossAutoScaler scale: the fp16 loss scale / (micro-batches x data-parallel size)), and
  // where training forwards sum the losses' logged values (null: not recorded, as in
  // recomputation and evaluation).
  float moe_aux_grad_scale = 1.f;
  MoELossSums* moe_losses = nullptr;
  // Full activation recomputation: the group of layers whose forward is running (set by its
  // first layer, joined by the next ones, closed by its last; never spans two chunks).
  std::shared_ptr<RecomputeGroup> recompute_group;
  // A forward re-run for backward (activation recomputation): FP8 linears quantize as the first
  // run did and record nothing (model/fp8.h).
  bool recomputing = false;
  // The running micro-batch's token layout (context parallelism, positions, documents); null:
  // whole sequences, positions 0..S-1, one document per sample. Set by GPTModel per chunk pass.
  std::shared_ptr<const SequenceLayout> seq;
  // Parameters whose gradient GEMMs are still running beside the pass (the grouped MoE experts'
  // weight gradients on the GPU; FP8 linears' under MT_FP8_WGRAD_OVERLAP, model/fp8.h): joined and
  // reported ready by join_deferred_expert_grads (model/moe/experts.h) when a chunk's backward ends.
  std::vector<const Param*> deferred_grads;
  uint64_t dropout_offset(uint64_t n) { return rng ? rng->next_offset(n) : 0; }
  RngState* region_rng(bool tp_region) const { return tp_region && tp_rng ? tp_rng : rng; }
  void before_use(const Param* p) {
    if (hooks && p) hooks->before_use(*p);
  }
  void grad_ready(const Param* p) {
    if (hooks && p) hooks->grad_ready(*p);
  }
};

// Charges the time of a scope to one OpTimes category (host clock or GPU events, see
// op_times.h); nested scopes are exclusive. A null OpTimes costs one branch.
class ScopedOpTimer {
 public:
  ScopedOpTimer(OpTimes* t, double OpTimes::*field) : t_(t) {
    if (t_) t_->begin(field);
  }
  ~ScopedOpTimer() {
    if (t_) t_->end();
  }
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  OpTimes* t_;
};

}  // namespace mt::model
