#include "model/moe/moe_layer.h"

#include <numeric>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

void MoELayer::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t layer_index,
                     const TensorParallel* tp) {
  cfg = c;
  MT_CHECK(!tp || !tp->on(), "MoE layers under tensor parallelism are not built yet (the arguments refuse them)");
  router.build(ps, prefix + ".router", c, layer_index, tp);
  experts.build(ps, prefix + ".experts", c, 0, c.moe.num_experts);
  has_shared = c.moe.shared_expert_intermediate_size > 0;
  if (has_shared) {
    TransformerConfig sc = c;
    sc.ffn_hidden_size = c.moe.shared_expert_intermediate_size;
    shared.build(ps, prefix + ".shared_experts", sc, tp);
    if (c.moe.shared_expert_gate)
      shared_gate = &ps.add(prefix + ".shared_experts.gate_weight", {1, c.hidden_size}, Init::Normal, true);
  }
}

Tensor MoELayer::forward(const Tensor& x, int64_t B, Saved& s, PassContext& ctx) const {
  Tensor probs, map;
  router.forward(x, B, s.router, ctx, probs, map);
  std::vector<int32_t> counts;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::permute);
    Tensor counts_d;
    s.token_rows = ops::moe_dispatch_plan(map, counts_d);
    // The host needs the counts for the experts' GEMM sizes: the layer's one device sync.
    const Tensor c = counts_d.to_device(Device::CPU);
    counts.assign(c.data<int32_t>(), c.data<int32_t>() + c.numel());
  }
  router.finish_forward(counts, s.router, ctx);
  const int64_t rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  Tensor xp;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::permute);
    xp = ops::moe_permute(x, s.token_rows, rows);
  }
  s.yp = experts.forward(xp, std::vector<int64_t>(counts.begin(), counts.end()), s.experts, ctx);
  s.probs = probs;
  Tensor y;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
    y = ops::moe_unpermute(s.yp, s.token_rows, probs);
  }
  if (has_shared) {
    Tensor sy = shared.forward(x, s.shared, ctx);
    if (shared_gate) {
      ctx.before_use(shared_gate);
      s.x = x;
      {
        ScopedOpTimer t(ctx.times, &OpTimes::gemm);
        s.gate = ops::linear_forward(x, shared_gate->value, nullptr);
      }
      s.shared_y = sy;
      ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
      sy = ops::sigmoid_gate_rows(sy, s.gate);
    }
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(y, sy);
  }
  return y;
}

Tensor MoELayer::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor dx_shared;
  if (has_shared) {
    Tensor dsy = dy;
    if (shared_gate) {
      Tensor dgate;
      {
        ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
        dsy = ops::sigmoid_gate_rows_backward(dy, s.shared_y, s.gate, dgate);
      }
      Tensor dg = dgate;
      if (s.x.dtype() != DType::F32) {
        dg = Tensor::empty(dgate.shape(), s.x.dtype(), dgate.device());
        ops::cast(dgate, dg);
      }
      ScopedOpTimer t(ctx.times, &OpTimes::gemm);
      dx_shared = ops::linear_backward(dg, s.x, shared_gate->value, shared_gate->grad, nullptr, true, true);
      ctx.grad_ready(shared_gate);
    }
    Tensor d = shared.backward(dsy, s.shared, ctx);
    if (dx_shared.defined()) ops::add_inplace(dx_shared, d);
    else dx_shared = d;
  }
  Tensor dyp, dprobs;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::unpermute);
    dyp = ops::moe_unpermute_backward(dy, s.yp, s.token_rows, s.probs, dprobs);
  }
  const Tensor dxp = experts.backward(dyp, s.experts, ctx);
  Tensor dx;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::permute);
    dx = ops::moe_permute_backward(dxp, s.token_rows);
  }
  const Tensor dx_router = router.backward(dprobs, s.router, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(dx, dx_router);
    if (dx_shared.defined()) ops::add_inplace(dx, dx_shared);
  }
  s = Saved{};
  return dx;
}

}  // namespace mt::model
