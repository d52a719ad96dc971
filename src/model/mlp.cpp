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

Tensor MLP::forward(const Tensor& x, Saved& s, PassContext& ctx, const Tensor* residual, const Tensor* x_amax) const {
  // A linear that keeps its input's FP8 codes for backward needs no copy of it here.
  s.x = fc1.keeps_input(x, ctx) ? Tensor() : x;
  s.h = fc1.forward(x, ctx, nullptr, x_amax);
  const int64_t rows = s.h.numel() / s.h.dim(-1);
  // The FP8 producer fusion (model/fp8.h, fp8_producer_amax). Delayed scaling: SwiGLU writes
  // linear_fc2's input codes itself (its time is charged to the elementwise ops), no bf16 copy.
  if (cfg.swiglu && fc2.wants_input_codes(rows, s.h.device(), ctx)) {
    Fp8Linear::ProducerCast pc = fc2.fp8.producer_cast(rows, local_ffn, s.h.dtype(), false);
    {
      ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
      ops::swiglu_forward_fp8(s.h, pc.scale, pc.format, pc.q, &pc.qt, pc.amax, pc.saturated);
    }
    s.a = Tensor();
    return fc2.forward_codes(pc, ctx, residual);
  }
  // Current scaling: SwiGLU also finds its output's amax, for linear_fc2's cast.
  Tensor a_amax = cfg.swiglu && fc2.wants_input_amax(rows, s.h.device(), ctx)
                      ? Tensor::empty({1}, DType::F32, s.h.device())
                      : Tensor();
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.a = cfg.swiglu ? ops::swiglu_forward(s.h, a_amax.defined() ? &a_amax : nullptr)
                     : ops::gelu_forward(s.h, cfg.openai_gelu);
  }
  MT_CHECK(s.a.dim(-1) == local_ffn, "MLP activation of {} columns, expected {} on this rank", s.a.dim(-1), local_ffn);
  const Tensor a = s.a;
  if (fc2.keeps_input(a, ctx)) s.a = Tensor();
  return fc2.forward(a, ctx, residual, a_amax.defined() ? &a_amax : nullptr);
}

Tensor MLP::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor da = fc2.backward(dy, s.a, ctx);
  // Delayed scaling (and current scaling with MT_FP8_SWIGLU_GRAD_CODES): SwiGLU's backward casts.
  if (cfg.swiglu && fc1.wants_grad_codes(ctx)) {
    const int64_t rows = s.h.numel() / s.h.dim(-1);
    Fp8Linear::ProducerCast pc = fc1.fp8.producer_cast(rows, s.h.dim(-1), da.dtype(), true);
    {
      ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
      if (pc.current) {  // the amax first, in a pass that stores nothing (model/fp8.h)
        ops::swiglu_backward_amax(da, s.h, pc.amax);
        fc1.fp8.producer_current_scale(pc, true);
      }
      ops::swiglu_backward_fp8(da, s.h, pc.scale, pc.format, pc.q, &pc.qt, pc.amax, pc.saturated);
    }
    Tensor dx = fc1.backward_codes(pc, s.x, ctx);
    s = Saved{};
    return dx;
  }
  Tensor dh;
  // SwiGLU's backward finds the amax of linear_fc1's output gradient likewise.
  Tensor dh_amax = cfg.swiglu && fc1.wants_grad_amax(ctx) ? Tensor::empty({1}, DType::F32, s.h.device()) : Tensor();
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    dh = cfg.swiglu ? ops::swiglu_backward(da, s.h, dh_amax.defined() ? &dh_amax : nullptr)
                    : ops::gelu_backward(da, s.h, cfg.openai_gelu);
  }
  Tensor dx = fc1.backward(dh, s.x, ctx, dh_amax.defined() ? &dh_amax : nullptr);
  s = Saved{};
  return dx;
}

}  // namespace mt::model
