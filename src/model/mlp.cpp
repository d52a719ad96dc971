#include "model/mlp.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

void MLP::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, const TensorParallel* tp) {
  cfg = c;
  // fc1 is column-parallel with [gate_r; up_r] per rank under SwiGLU, fc2 row-parallel.
  local_ffn = c.ffn_hidden_size / (tp ? tp->size() : 1);
  fc1.build(ps, prefix + ".linear_fc1", c.hidden_size, c.fc1_out(), c.add_bias_linear, Init::Normal,
            ParallelMode::Column, tp, c.swiglu ? 2 : 1);
  fc2.build(ps, prefix + ".linear_fc2", c.ffn_hidden_size, c.hidden_size, c.add_bias_linear, Init::ScaledNormal,
            ParallelMode::Row, tp);
}

Tensor MLP::forward(const Tensor& x, Saved& s, PassContext& ctx, const Tensor* residual) const {
  // A linear that keeps its input's FP8 codes for backward needs no copy of it here.
  s.x = fc1.keeps_input(x, ctx) ? Tensor() : x;
  s.h = fc1.forward(x, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.a = cfg.swiglu ? ops::swiglu_forward(s.h) : ops::gelu_forward(s.h, cfg.openai_gelu);
  }
  MT_CHECK(s.a.dim(-1) == local_ffn, "MLP activation of {} columns, expected {} on this rank", s.a.dim(-1), local_ffn);
  const Tensor a = s.a;
  if (fc2.keeps_input(a, ctx)) s.a = Tensor();
  return fc2.forward(a, ctx, residual);
}

Tensor MLP::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor da = fc2.backward(dy, s.a, ctx);
  Tensor dh;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    dh = cfg.swiglu ? ops::swiglu_backward(da, s.h) : ops::gelu_backward(da, s.h, cfg.openai_gelu);
  }
  Tensor dx = fc1.backward(dh, s.x, ctx);
  s = Saved{};
  return dx;
}

}  // namespace mt::model
