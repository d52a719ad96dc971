#pragma once
// AdamW as torch.optim.AdamW (and Apex/TE FusedAdam with adam_w_mode=True), which Megatron
// uses for --optimizer adam: decoupled weight decay p *= 1 - lr*wd applied before the Adam
// update, bias correction from the step count, fp32 moments. amsgrad and maximize are not
// offered (Megatron never sets them). The update is ops::adamw_step, on the moments' device.
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device);
  void update(Tensor& params, const Tensor& grads, const StepRates& rates, const ops::HalfCopy& copy) override;
  std::vector<StateTensor> state() override;  // exp_avg, exp_avg_sq
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t n) override { step_ = n; }

 private:
  double beta1_, beta2_, eps_;
  SegmentGroups segments_;
  Tensor exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace mt::optim
