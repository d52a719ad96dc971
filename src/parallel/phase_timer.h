#pragma once
// A hook for timing the phases of a step by name (Megatron's timers: training/timers.h). The
// pipeline marks its per-micro-batch phases (forward-compute, backward-compute, the p2p
// transfers) through it when one is set; the training layer implements it.
namespace mt::parallel {

class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void start(const char* name) = 0;
  virtual void stop(const char* name) = 0;
};

// Times one phase for the length of a scope; a no-op without a timer.
class PhaseScope {
 public:
  PhaseScope(PhaseTimer* t, const char* name) : t_(t), name_(name) {
    if (t_) t_->start(name_);
  }
  ~PhaseScope() {
    if (t_) t_->stop(name_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* t_;
  const char* name_;
};

}  // namespace mt::parallel
