#include "optim/sgd.h"

#include "optim/hyper.h"

namespace mt::optim {

SGD::SGD(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device)
    : momentum_(as_decimal(cfg.sgd_momentum)), segments_(make_segment_groups(numel, std::move(spans))) {
  if (momentum_ != 0.0) momentum_buffer_ = Tensor::zeros({numel}, DType::F32, device);
}

void SGD::update(Tensor& params, const Tensor& grads, const StepRates& rates, const ops::HalfCopy& copy) {
  ops::SGDStep h;
  h.weight_decay = rates.weight_decay;
  h.momentum = momentum_;
  h.grad_scale = rates.grad_scale;
  // torch creates the buffer as a copy of the first d_p rather than decaying zeros; the step
  // count stands in for "buffer not yet created" so a restored run behaves the same.
  h.first = step_ == 0;
  ++step_;
  Tensor* buf = momentum_buffer_.defined() ? &momentum_buffer_ : nullptr;
  h.lr = rates.lr;
  ops::sgd_step(params, grads, buf, segments_.main, h, copy);
  if (segments_.decoupled.empty()) return;
  h.lr = rates.decoupled_lr;
  ops::sgd_step(params, grads, buf, segments_.decoupled, h, copy);
}

std::vector<StateTensor> SGD::state() {
  if (!momentum_buffer_.defined()) return {};
  return {{"momentum_buffer", 0, momentum_buffer_.numel(), momentum_buffer_}};
}

}  // namespace mt::optim
