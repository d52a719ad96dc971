#include "model/mlp.h"

#include "kernels/cpu/ops.h"

namespace mt::model {

void MLP::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c) {
  cfg = c;
  fc1.build(ps, prefix + ".linear_fc1", c.hidden_size, c.fc1_out(), c.add_bias_linear, Init::Normal);
  fc2.build(ps, prefix + ".linear_fc2", c.ffn_hidden_size, c.hidden_size, c.add_bias_linear, Init::ScaledNormal);
}

Tensor MLP::forward(const Tensor& x, Saved& s, PassContext& ctx) const {
  s.x = x;
  s.h = fc1.forward(x, ctx);
  int64_t rows = x.dim(0), F = cfg.ffn_hidden_size;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.a = Tensor::empty({rows, F});
    if (cfg.swiglu) cpu::swiglu_forward(s.h.data<float>(), s.a.data<float>(), rows, F);
    else cpu::gelu_forward(s.h.data<float>(), s.a.data<float>(), rows * F, cfg.openai_gelu);
  }
  return fc2.forward(s.a, ctx);
}

Tensor MLP::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor da = fc2.backward(dy, s.a, ctx);
  int64_t rows = dy.dim(0), F = cfg.ffn_hidden_size;
  Tensor dh = Tensor::empty(s.h.shape());
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    if (cfg.swiglu) cpu::swiglu_backward(da.data<float>(), s.h.data<float>(), dh.data<float>(), rows, F);
    else cpu::gelu_backward(da.data<float>(), s.h.data<float>(), dh.data<float>(), rows * F, cfg.openai_gelu);
  }
  Tensor dx = fc1.backward(dh, s.x, ctx);
  s = Saved{};
  return dx;
}

}  // namespace mt::model
