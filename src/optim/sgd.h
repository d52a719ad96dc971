#pragma once
// SGD as torch.optim.SGD with the settings Megatron passes (--optimizer sgd): momentum
// from --sgd-momentum, no dampening, no Nesterov, and L2 weight decay folded into the
// gradient (g + wd*p), not decoupled. The update is ops::sgd_step, on the buffer's device.
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

class SGD final : public Optimizer {
 public:
  SGD(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device);
  void update(Tensor& params, const Tensor& grads, const StepRates& rates, const ops::HalfCopy& copy) override;
  // "momentum_buffer" when momentum != 0; torch keeps no state otherwise.
  std::vector<StateTensor> state() override;
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t n) override { step_ = n; }

 private:
  double momentum_;
  SegmentGroups segments_;
  Tensor momentum_buffer_;  // undefined without momentum
  int64_t step_ = 0;
};

}  // namespace mt::optim
