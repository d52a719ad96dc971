#pragma once
// AdamW as torch.optim.AdamW (and Apex/TE FusedAdam with adam_w_mode=True), which Megatron
// uses for --optimizer adam: decoupled weight decay p *= 1 - lr*wd applied before the Adam
// update, bias correction from the step count, fp32 moments. amsgrad and maximize are not
// offered (Megatron never sets them).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans);
  void step(float* params, const float* grads, float lr, float weight_decay) override;
  std::vector<std::pair<std::string, std::vector<float>*>> state() override;
  int64_t step_count() const override { return step_; }
  void set_step_count(int64_t n) override { step_ = n; }

 private:
  double beta1_, beta2_, eps_;
  int64_t numel_;
  std::vector<Segment> segments_;
  std::vector<float> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace mt::optim
