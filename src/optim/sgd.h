#pragma once
// SGD as torch.optim.SGD with the settings Megatron passes (--optimizer sgd): momentum
// from --sgd-momentum, no dampening, no Nesterov, and L2 weight decay folded into the
// gradient (g + wd*p), not decoupled.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

class SGD final : public Optimizer {
 public:
  SGD(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans);
  void step(float* params, const float* grads, float lr, float weight_decay) override;
  // "momentum_buffer" when momentum != 0; torch keeps no state otherwise.
  std::vector<std::pair<std::string, std::vector<float>*>> state() override;
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t n) override { step_ = n; }

 private:
  double momentum_;
  int64_t numel_;
  std::vector<Segment> segments_;
  std::vector<float> momentum_buffer_;
  int64_t step_ = 0;
};

}  // namespace mt::optim
