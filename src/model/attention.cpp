#include "model/attention.h"

#include <cmath>

#include "kernels/ops.h"

namespace mt::model {

void RopeTables::build(int64_t seq, int64_t rd, double base) {
  rot_dim = rd;
  cos = Tensor::empty({seq, rd / 2});
  sin = Tensor::empty({seq, rd / 2});
  cpu::rope_tables(seq, rd, base, cos.data<float>(), sin.data<float>());
}

void SelfAttention::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c,
                          const RopeTables* r, const TensorParallel* tp) {
  cfg = c;
  rope = r;
  // Whole query groups go to each TP rank; linear_qkv packs per group [q heads; k; v], so a
  // rank's groups are one contiguous block of its rows, and its heads a contiguous block of
  // linear_proj's input columns. `cfg` keeps this rank's head and group counts.
  const int n = tp ? tp->size() : 1;
  cfg.num_attention_heads = c.num_attention_heads / n;
  cfg.num_query_groups = c.num_query_groups / n;
  qkv.build(ps, prefix + ".linear_qkv", c.hidden_size, c.qkv_out(), c.add_qkv_bias, Init::Normal,
            ParallelMode::Column, tp);
  proj.build(ps, prefix + ".linear_proj", c.num_attention_heads * c.kv_channels, c.hidden_size, c.add_bias_linear,
             Init::ScaledNormal, ParallelMode::Row, tp);
}


Tensor SelfAttention::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  s.x = x;
  Tensor packed = qkv.forward(x, ctx);
  ScopedOpTimer t(ctx.times, &OpTimes::attention);
  ops::qkv_split(packed, s.q, s.k, s.v, S, B, G, qpg, D);
  if (rope) {
    ops::rope_forward(s.q, rope->cos, rope->sin, rope->rot_dim);
    ops::rope_forward(s.k, rope->cos, rope->sin, rope->rot_dim);
  }
  cpu::AttnParams p{B, Hq, G, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
  p.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
  if (p.dropout_p > 0.f) {
    RngState* rng = ctx.region_rng(true);  // a TP region: each rank's heads get their own masks
    p.seed = s.seed = rng->seed;
    p.offset = s.offset = rng->next_offset(1);
  }
  ops::attention_forward(p, s.q, s.k, s.v, s.out, s.lse);
  s.ctx = ops::heads_to_rows(s.out, S, B, Hq, D);
  return proj.forward(s.ctx, ctx);
}

Tensor SelfAttention::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  Tensor dctx = proj.backward(dy, s.ctx, ctx);
  Tensor dx;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::attention);
    Tensor dout = ops::rows_to_heads(dctx, S, B, Hq, D);
    cpu::AttnParams p{B, Hq, G, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
    p.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
    p.seed = s.seed;
    p.offset = s.offset;
    Tensor dq, dk, dv;
    ops::attention_backward(p, s.q, s.k, s.v, s.out, s.lse, dout, dq, dk, dv);
    if (rope) {
      ops::rope_backward(dq, rope->cos, rope->sin, rope->rot_dim);
      ops::rope_backward(dk, rope->cos, rope->sin, rope->rot_dim);
    }
    dx = ops::qkv_merge(dq, dk, dv, S, B, G, qpg, D);
  }
  Tensor dxin = qkv.backward(dx, s.x, ctx);
  s = Saved{};
  return dxin;
}

}  // namespace mt::model
