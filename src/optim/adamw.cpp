#include "optim/adamw.h"

#include "optim/hyper.h"

namespace mt::optim {

AdamW::AdamW(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device)
    : beta1_(as_decimal(cfg.adam_beta1)),
      beta2_(as_decimal(cfg.adam_beta2)),
      eps_(as_decimal(cfg.adam_eps)),
      segments_(make_segment_groups(numel, std::move(spans))),
      exp_avg_(Tensor::zeros({numel}, DType::F32, device)),
      exp_avg_sq_(Tensor::zeros({numel}, DType::F32, device)) {}

void AdamW::update(Tensor& params, const Tensor& grads, const StepRates& rates, const ops::HalfCopy& copy) {
  ++step_;  // one step for both groups: they share the bias correction, as torch's param groups do
  ops::AdamWStep h;
  h.weight_decay = rates.weight_decay;
  h.beta1 = beta1_;
  h.beta2 = beta2_;
  h.eps = eps_;
  h.step = step_;
  h.grad_scale = rates.grad_scale;
  h.lr = rates.lr;
  ops::adamw_step(params, grads, exp_avg_, exp_avg_sq_, segments_.main, h, copy);
  if (segments_.decoupled.empty()) return;
  h.lr = rates.decoupled_lr;
  ops::adamw_step(params, grads, exp_avg_, exp_avg_sq_, segments_.decoupled, h, copy);
}

std::vector<StateTensor> AdamW::state() {
  const int64_t n = exp_avg_.numel();
  return {{"exp_avg", 0, n, exp_avg_}, {"exp_avg_sq", 0, n, exp_avg_sq_}};
}

}  // namespace mt::optim
