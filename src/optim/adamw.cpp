#include "optim/adamw.h"

#include <cmath>

#include "optim/hyper.h"

namespace mt::optim {

AdamW::AdamW(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans)
    : beta1_(as_decimal(cfg.adam_beta1)),
      beta2_(as_decimal(cfg.adam_beta2)),
      eps_(as_decimal(cfg.adam_eps)),
      numel_(numel),
      segments_(make_segments(numel, std::move(spans))),
      exp_avg_(static_cast<size_t>(numel), 0.0f),
      exp_avg_sq_(static_cast<size_t>(numel), 0.0f) {}

void AdamW::step(float* params, const float* grads, float lr, float weight_decay) {
  ++step_;
  // Per-step scalars in double, as torch computes them on the host; the elementwise math is
  // fp32 with these rounded once, as in torch's single-tensor path.
  const double lr_d = lr, wd_d = weight_decay;
  const double bias_correction1 = 1.0 - std::pow(beta1_, static_cast<double>(step_));
  const double bias_correction2 = 1.0 - std::pow(beta2_, static_cast<double>(step_));
  const float step_size = static_cast<float>(lr_d / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay_factor = static_cast<float>(1.0 - lr_d * wd_d);
  const float b1 = static_cast<float>(beta1_), omb1 = static_cast<float>(1.0 - beta1_);
  const float b2 = static_cast<float>(beta2_), omb2 = static_cast<float>(1.0 - beta2_);
  const float eps = static_cast<float>(eps_);
  float* m = exp_avg_.data();
  float* v = exp_avg_sq_.data();

#pragma omp parallel if (numel_ > kParallelThreshold)
  for (const Segment& seg : segments_) {
    // torch skips the multiply when weight_decay == 0; multiplying by exactly 1 is the same.
    const float df = seg.weight_decay ? decay_factor : 1.0f;
#pragma omp for schedule(static) nowait
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      const float g = grads[i];
      const float p = params[i] * df;
      const float mi = b1 * m[i] + omb1 * g;
      const float vi = b2 * v[i] + omb2 * g * g;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      params[i] = p - step_size * mi / denom;
    }
  }
}

std::vector<std::pair<std::string, std::vector<float>*>> AdamW::state() {
  return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
}

}  // namespace mt::optim
