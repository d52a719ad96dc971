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

struct PassContext {
  bool training = true;
  RngState* rng = nullptr;  // dropout stream; offsets are drawn in a fixed order per pass
  OpTimes* times = nullptr;
  uint64_t dropout_offset(uint64_t n) { return rng ? rng->next_offset(n) : 0; }
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
