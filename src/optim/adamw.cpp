#include "optim/adamw.h"

#include "optim/hyper.h"

namespace mt::optim {

AdamW::AdamW(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device)
    : beta1_(as_decimal(cfg.adam_beta1)),
      beta2_(as_decimal(cfg.adam_beta2)),
      eps_(as_decimal(cfg.adam_eps)),
      segments_(make_segments(numel, std::move(spans))),
      exp_avg_(Tensor::zeros({numel}, DType::F32, device)),
      exp_avg_sq_(Tensor::zeros({numel}, DType::F32, device)) {}

void AdamW::step(Tensor& params, const Tensor& grads, double lr, double weight_decay, float grad_scale,
                 const ops::HalfCopy& copy) {
  ++step_;
  ops::AdamWStep h;
  h.lr = lr;
  h.weight_decay = weight_decay;
  h.beta1 = beta1_;
  h.beta2 = beta2_;
  h.eps = eps_;
  h.step = step_;
  h.grad_scale = grad_scale;
  ops::adamw_step(params, grads, exp_avg_, exp_avg_sq_, segments_, h, copy);
}

std::vector<StateTensor> AdamW::state() {
  const int64_t n = exp_avg_.numel();
  return {{"exp_avg", 0, n, exp_avg_}, {"exp_avg_sq", 0, n, exp_avg_sq_}};
}

}  // namespace mt::optim
