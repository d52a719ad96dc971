#include "optim/sgd.h"

#include "optim/hyper.h"

namespace mt::optim {

SGD::SGD(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans, Device device)
    : momentum_(as_decimal(cfg.sgd_momentum)), segments_(make_segments(numel, std::move(spans))) {
  if (momentum_ != 0.0) momentum_buffer_ = Tensor::zeros({numel}, DType::F32, device);
}

void SGD::step(Tensor& params, const Tensor& grads, double lr, double weight_decay, float grad_scale,
               const ops::HalfCopy& copy) {
  ops::SGDStep h;
  h.lr = lr;
  h.weight_decay = weight_decay;
  h.momentum = momentum_;
  // torch creates the buffer as a copy of the first d_p rather than decaying zeros; the step
  // count stands in for "buffer not yet created" so a restored run behaves the same.
  h.first = step_ == 0;
  h.grad_scale = grad_scale;
  ++step_;
  ops::sgd_step(params, grads, momentum_buffer_.defined() ? &momentum_buffer_ : nullptr, segments_, h, copy);
}

std::vector<StateTensor> SGD::state() {
  if (!momentum_buffer_.defined()) return {};
  return {{"momentum_buffer", 0, momentum_buffer_.numel(), momentum_buffer_}};
}

}  // namespace mt::optim
