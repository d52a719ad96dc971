#include "model/transformer_layer.h"

#include "kernels/ops.h"

namespace mt::model {

void TransformerLayer::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c,
                             const RopeTables* rope, const TensorParallel* tp) {
  cfg = c;
  // Megatron-core names: input_layernorm, self_attention, pre_mlp_layernorm, mlp.
  input_norm.build(ps, prefix + ".input_layernorm", c, tp);
  attn.build(ps, prefix + ".self_attention", c, rope, tp);
  pre_mlp_norm.build(ps, prefix + ".pre_mlp_layernorm", c, tp);
  mlp.build(ps, prefix + ".mlp", c, tp);
  attn_drop.p = c.hidden_dropout;
  mlp_drop.p = c.hidden_dropout;
  // Under SP the residual stream is a sequence shard: its dropout masks differ per TP rank.
  attn_drop.tp_region = mlp_drop.tp_region = tp && tp->sp();
}

Tensor TransformerLayer::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  Tensor a = attn.forward(input_norm.forward(x, s.n1, ctx), S, B, s.attn, ctx);
  Tensor h = attn_drop.forward(a, s.d1, ctx);
  if (h.raw() == a.raw()) h = a;  // dropout off: reuse the buffer
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(h, x);
    if (cfg.bf16) round_to_bf16_inplace(h);
  }
  Tensor m = mlp.forward(pre_mlp_norm.forward(h, s.n2, ctx), s.mlp, ctx);
  Tensor y = mlp_drop.forward(m, s.d2, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(y, h);
    if (cfg.bf16) round_to_bf16_inplace(y);
  }
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  // dy flows to h directly (residual) and through mlp_drop -> mlp -> pre_mlp_norm.
  Tensor dh = pre_mlp_norm.backward(mlp.backward(mlp_drop.backward(dy, s.d2), s.mlp, ctx), s.n2, ctx);
  ops::add_inplace(dh, dy);
  Tensor dx = input_norm.backward(attn.backward(attn_drop.backward(dh, s.d1), S, B, s.attn, ctx), s.n1, ctx);
  ops::add_inplace(dx, dh);
  return dx;
}

}  // namespace mt::model
