#include "model/moe/moe_layer.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

void MoELayer::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t layer_index,
                     const TensorParallel* tp, const ExpertParallel* ep) {
  cfg = c;
  // Without SP every TP rank would route the same tokens to the same experts (the arguments
  // refuse it, as Megatron's).
  MT_CHECK(!tp || !tp->on() || tp->sp(), "MoE layers under tensor parallelism need sequence parallelism");
  const ExpertParallel where = ep ? *ep : ExpertParallel{};
  router.build(ps, prefix + ".router", c, layer_index, tp);
  const int64_t local = c.moe.num_experts / where.ep_size();
  experts.build(ps, prefix + ".experts", c, where.ep_rank() * local, local, &where);
  dispatcher = make_token_dispatcher(c.moe.token_dispatcher, where, c.moe.num_experts);
  has_shared = c.moe.shared_expert_intermediate_size > 0;
  if (has_shared) {
    TransformerConfig sc = c;
    sc.ffn_hidden_size = c.moe.shared_expert_intermediate_size;
    shared.build(ps, prefix + ".shared_experts", sc, tp);
    if (c.moe.shared_expert_gate) {
      shared_gate = &ps.add(prefix + ".shared_experts.gate_weight", {1, c.hidden_size}, Init::Normal, true);
      shared_gate->sequence_parallel = tp && tp->sp();  // it sees this rank's sequence shard
    }
  }
}

Tensor MoELayer::forward(const Tensor& x, int64_t B, Saved& s, PassContext& ctx) const {
  Tensor probs, map;
  router.forward(x, B, s.router, ctx, probs, map);
  std::vector<int64_t> counts;
  std::vector<int32_t> routed;
  Tensor sy;  // the shared expert's output; with the overlap it is computed during the dispatch
  const bool overlap = has_shared && cfg.moe.shared_expert_overlap;
  const TokenDispatcher::InFlight shared_forward = [&] { sy = shared_expert_forward(x, s, ctx); };
  s.dispatch.expected_rows = cfg.moe.capacity_factor > 0 ? -1 : map.dim(0) * cfg.moe.topk;
  const Tensor xp = dispatcher->dispatch(x, probs, map, s.dispatch, counts, routed, ctx,
                                         overlap ? shared_forward : TokenDispatcher::InFlight());
  router.finish_forward(routed, s.router, ctx);
  Tensor y = dispatcher->combine(experts.forward(xp, counts, s.experts, ctx), s.dispatch, ctx);
  if (has_shared) {
    if (!overlap) shared_forward();
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(y, sy);
  }
  return y;
}

Tensor MoELayer::shared_expert_forward(const Tensor& x, Saved& s, PassContext& ctx) const {
  Tensor sy = shared.forward(x, s.shared, ctx);
  if (!shared_gate) return sy;
  ctx.before_use(shared_gate);
  s.x = x;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    s.gate = ops::linear_forward(x, shared_gate->value, nullptr);
  }
  s.shared_y = sy;
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  return ops::sigmoid_gate_rows(sy, s.gate);
}

Tensor MoELayer::shared_expert_backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor dx_gate, dsy = dy;
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
    dx_gate = ops::linear_backward(dg, s.x, shared_gate->value, shared_gate->grad, nullptr, true, true);
    ctx.grad_ready(shared_gate);
  }
  const Tensor d = shared.backward(dsy, s.shared, ctx);
  if (!dx_gate.defined()) return d;
  ops::add_inplace(dx_gate, d);
  return dx_gate;
}

Tensor MoELayer::backward(const Tensor& dy, Saved& s, PassContext& ctx) const {
  Tensor dx_shared;
  const bool overlap = has_shared && cfg.moe.shared_expert_overlap;
  const TokenDispatcher::InFlight shared_backward = [&] { dx_shared = shared_expert_backward(dy, s, ctx); };
  if (has_shared && !overlap) shared_backward();
  Tensor dprobs;
  const Tensor dyp = dispatcher->combine_backward(dy, s.dispatch, dprobs, ctx,
                                                  overlap ? shared_backward : TokenDispatcher::InFlight());
  const Tensor dxp = experts.backward(dyp, s.experts, ctx);
  Tensor dx = dispatcher->dispatch_backward(dxp, s.dispatch, ctx);
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
