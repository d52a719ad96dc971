#pragma once
// Per-micro-batch state shared by the modules of one forward/backward pass: whether we are
// training (dropout on), where dropout draws its Philox numbers, and op timers.
#include <chrono>
#include <cstdint>

#include "core/philox.h"

namespace mt::model {

struct OpTimes {
  double gemm = 0, attention = 0, norm = 0, elementwise = 0, loss = 0;
};

struct Param;

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
  RngState* rng = nullptr;  // dropout stream; offsets are drawn in a fixed order per pass
  // Megatron's model-parallel RNG: dropout inside tensor-parallel regions (attention
  // probabilities, and everything on sequence shards under --sequence-parallel) draws from a
  // stream seeded per TP rank, so ranks holding different heads or rows use different masks.
  // Null without TP: those dropouts use `rng`.
  RngState* tp_rng = nullptr;
  OpTimes* times = nullptr;
  ParamHooks* hooks = nullptr;
  uint64_t dropout_offset(uint64_t n) { return rng ? rng->next_offset(n) : 0; }
  RngState* region_rng(bool tp_region) const { return tp_region && tp_rng ? tp_rng : rng; }
  void before_use(const Param* p) {
    if (hooks && p) hooks->before_use(*p);
  }
  void grad_ready(const Param* p) {
    if (hooks && p) hooks->grad_ready(*p);
  }
};

// Adds the wall time of a scope to one OpTimes field (when timing is on).
class ScopedOpTimer {
 public:
  ScopedOpTimer(OpTimes* t, double OpTimes::*field) : t_(t), field_(field) {
    if (t_) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedOpTimer() {
    if (t_) t_->*field_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  OpTimes* t_;
  double OpTimes::*field_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace mt::model
