#include "optim/sgd.h"

#include "optim/hyper.h"

namespace mt::optim {

SGD::SGD(const OptimizerConfig& cfg, int64_t numel, std::vector<ParamSpan> spans)
    : momentum_(as_decimal(cfg.sgd_momentum)),
      numel_(numel),
      segments_(make_segments(numel, std::move(spans))) {
  if (momentum_ != 0.0) momentum_buffer_.assign(static_cast<size_t>(numel), 0.0f);
}

void SGD::step(float* params, const float* grads, float lr, float weight_decay) {
  // torch creates the buffer as a copy of the first d_p rather than decaying zeros; the
  // step count stands in for "buffer not yet created" so a restored run behaves the same.
  const bool first = step_ == 0;
  ++step_;
  const bool use_momentum = momentum_ != 0.0;
  const float mom = static_cast<float>(momentum_);
  const float neg_lr = -lr;
  float* buf = momentum_buffer_.data();

#pragma omp parallel if (numel_ > kParallelThreshold)
  for (const Segment& seg : segments_) {
    const float wd = seg.weight_decay ? weight_decay : 0.0f;
#pragma omp for schedule(static) nowait
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      float d_p = grads[i];
      if (wd != 0.0f) d_p = d_p + wd * params[i];
      if (use_momentum) {
        buf[i] = first ? d_p : buf[i] * mom + d_p;
        d_p = buf[i];
      }
      params[i] = params[i] + neg_lr * d_p;
    }
  }
}

std::vector<std::pair<std::string, std::vector<float>*>> SGD::state() {
  if (momentum_ == 0.0) return {};
  return {{"momentum_buffer", &momentum_buffer_}};
}

}  // namespace mt::optim
