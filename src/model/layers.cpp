#include "model/layers.h"

#include "kernels/cpu/ops.h"

namespace mt::model {

void Linear::build(ParamStore& ps, const std::string& prefix, int64_t in_f, int64_t out_f, bool with_bias,
                   Init init) {
  in = in_f;
  out = out_f;
  weight = &ps.add(prefix + ".weight", {out, in}, init, true);
  bias = with_bias ? &ps.add(prefix + ".bias", {out}, Init::Zeros, false) : nullptr;
}

Tensor Linear::forward(const Tensor& x, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  int64_t rows = x.numel() / in;
  Tensor y = Tensor::empty({rows, out});
  cpu::linear_forward(x.data<float>(), weight->value.data<float>(), bias ? bias->value.data<float>() : nullptr,
                      y.data<float>(), rows, out, in);
  return y;
}

Tensor Linear::backward(const Tensor& dy, const Tensor& x, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  int64_t rows = x.numel() / in;
  Tensor dx = Tensor::empty({rows, in});
  cpu::linear_backward(dy.data<float>(), x.data<float>(), weight->value.data<float>(), dx.data<float>(),
                       weight->grad.data<float>(), bias ? bias->grad.data<float>() : nullptr, rows, out, in);
  return dx;
}

void Norm::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& cfg) {
  rms = cfg.rmsnorm();
  eps = cfg.norm_epsilon;
  weight = &ps.add(prefix + ".weight", {cfg.hidden_size}, Init::Ones, false);
  bias = rms ? nullptr : &ps.add(prefix + ".bias", {cfg.hidden_size}, Init::Zeros, false);
}

Tensor Norm::forward(const Tensor& x, Saved& s, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::norm);
  int64_t dim = weight->numel(), rows = x.numel() / dim;
  Tensor y = Tensor::empty({rows, dim});
  s.x = x;
  s.rstd = Tensor::empty({rows});
  if (rms) {
    cpu::rmsnorm_forward(x.data<float>(), weight->value.data<float>(), y.data<float>(), s.rstd.data<float>(), rows,
                         dim, eps);
  } else {
    s.mean = Tensor::empty({rows});
    cpu::layernorm_forward(x.data<float>(), weight->value.data<float>(), bias->value.data<float>(), y.data<float>(),
                           s.mean.data<float>(), s.rstd.data<float>(), rows, dim, eps);
  }
  return y;
}

Tensor Norm::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::norm);
  int64_t dim = weight->numel(), rows = dy.numel() / dim;
  Tensor dx = Tensor::empty({rows, dim});
  if (rms) {
    cpu::rmsnorm_backward(dy.data<float>(), s.x.data<float>(), weight->value.data<float>(), s.rstd.data<float>(),
                          dx.data<float>(), weight->grad.data<float>(), rows, dim);
  } else {
    cpu::layernorm_backward(dy.data<float>(), s.x.data<float>(), weight->value.data<float>(), s.mean.data<float>(),
                            s.rstd.data<float>(), dx.data<float>(), weight->grad.data<float>(),
                            bias->grad.data<float>(), rows, dim);
  }
  s = Saved{};
  return dx;
}

Tensor Dropout::forward(const Tensor& x, Saved& s, PassContext& ctx) const {
  s.active = ctx.training && p > 0.f;
  if (!s.active) return x;
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  s.seed = ctx.rng->seed;
  s.offset = ctx.dropout_offset(1);
  Tensor y = Tensor::empty(x.shape());
  cpu::dropout_forward(x.data<float>(), y.data<float>(), x.numel(), p, s.seed, s.offset);
  return y;
}

Tensor Dropout::backward(const Tensor& dy, const Saved& s) const {
  if (!s.active) return dy;
  Tensor dx = Tensor::empty(dy.shape());
  cpu::dropout_backward(dy.data<float>(), dx.data<float>(), dy.numel(), p, s.seed, s.offset);
  return dx;
}

void round_to_bf16_inplace(Tensor& t) {
  float* d = t.data<float>();
  int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = round_bf16(d[i]);
}

}  // namespace mt::model
