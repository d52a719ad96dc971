#include "model/attention.h"

#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace mt::model {

void RopeTables::build(int64_t seq, int64_t rd, double base) {
  rot_dim = rd;
  cos = Tensor::empty({seq, rd / 2});
  sin = Tensor::empty({seq, rd / 2});
  cpu::rope_tables(seq, rd, base, cos.data<float>(), sin.data<float>());
}

void RopeTables::build(int64_t seq, int64_t rd, const TransformerConfig& c) {
  if (!c.rope_scaling) return build(seq, rd, c.rotary_base);
  rot_dim = rd;
  cos = Tensor::empty({seq, rd / 2});
  sin = Tensor::empty({seq, rd / 2});
  // Llama 3.1 (HF rope_type "llama3"): wavelengths longer than original/low_freq_factor are
  // stretched by `factor`, shorter than original/high_freq_factor kept, and the band between
  // interpolated smoothly. Angles in double, as the unscaled tables.
  const double lo_wl = static_cast<double>(c.rope_original_max_position) / c.rope_low_freq_factor;
  const double hi_wl = static_cast<double>(c.rope_original_max_position) / c.rope_high_freq_factor;
  const double two_pi = 6.283185307179586;
  std::vector<double> inv(static_cast<size_t>(rd / 2));
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double f = std::pow(c.rotary_base, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
    const double wl = two_pi / f;
    double g = f;
    if (wl > lo_wl) {
      g = f / c.rope_scaling_factor;
    } else if (wl >= hi_wl) {
      const double smooth = (static_cast<double>(c.rope_original_max_position) / wl - c.rope_low_freq_factor) /
                            (c.rope_high_freq_factor - c.rope_low_freq_factor);
      g = (1.0 - smooth) * f / c.rope_scaling_factor + smooth * f;
    }
    inv[static_cast<size_t>(i)] = g;
  }
  float* cs = cos.data<float>();
  float* sn = sin.data<float>();
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t i = 0; i < rd / 2; ++i) {
      const double a = static_cast<double>(s) * inv[static_cast<size_t>(i)];
      cs[s * (rd / 2) + i] = static_cast<float>(std::cos(a));
      sn[s * (rd / 2) + i] = static_cast<float>(std::sin(a));
    }
}

void SelfAttention::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c,
                          const RopeTables* r, const TensorParallel* tp) {
  cfg = c;
  rope = r;
  recompute_core = c.recompute_selective();
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
  if (c.qk_layernorm) {
    TransformerConfig hc = c;
    hc.hidden_size = c.kv_channels;
    q_norm.build(ps, prefix + ".q_layernorm", hc);
    k_norm.build(ps, prefix + ".k_layernorm", hc);
    // Shared by all heads, and each TP rank sees only its heads: the gradients are partial per
    // TP rank and are summed over TP like those of sequence-parallel norms.
    const bool split = tp && tp->on();
    for (Param* p : {q_norm.weight, q_norm.bias, k_norm.weight, k_norm.bias})
      if (p) p->sequence_parallel = split;
  }
}

namespace {
// A norm over the last dimension of [B, H, S, D].
Tensor head_norm_forward(const Norm& n, const Tensor& x, Norm::Saved& s, PassContext& ctx) {
  return n.forward(x.view({-1, x.dim(-1)}), s, ctx).view(x.shape());
}
Tensor head_norm_backward(const Norm& n, const Tensor& dy, Norm::Saved& s, PassContext& ctx) {
  return n.backward(dy.view({-1, dy.dim(-1)}), s, ctx).view(dy.shape());
}

// The attention core's parameters for this rank's heads, with the dropout this pass drew.
cpu::AttnParams core_params(const TransformerConfig& cfg, int64_t S, int64_t B, const SelfAttention::Saved& s) {
  const int64_t D = cfg.kv_channels;
  cpu::AttnParams p{B, cfg.num_attention_heads, cfg.num_query_groups, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
  p.dropout_p = s.dropout_p;
  p.seed = s.seed;
  p.offset = s.offset;
  return p;
}
}  // namespace

Tensor SelfAttention::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  s.x = x;
  Tensor packed = qkv.forward(x, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::qkv_split(packed, s.q, s.k, s.v, S, B, G, qpg, D);
  }
  packed = Tensor();
  if (cfg.qk_layernorm) {
    s.q = head_norm_forward(q_norm, s.q, s.qn, ctx);
    s.k = head_norm_forward(k_norm, s.k, s.kn, ctx);
  }
  if (rope) {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::rope_forward(s.q, rope->cos, rope->sin, rope->rot_dim);
    ops::rope_forward(s.k, rope->cos, rope->sin, rope->rot_dim);
  }
  s.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
  if (s.dropout_p > 0.f) {
    RngState* rng = ctx.region_rng(true);  // a TP region: each rank's heads get their own masks
    s.seed = rng->seed;
    s.offset = rng->next_offset(1);
  }
  Tensor out, lse;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::attention);
    ops::attention_forward(core_params(cfg, S, B, s), s.q, s.k, s.v, out, lse);
  }
  Tensor c;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    c = ops::heads_to_rows(out, S, B, Hq, D);
  }
  // Selective recomputation drops the core's outputs (out, its row-layout copy for linear_proj,
  // and lse); backward rebuilds them from q, k, v and the recorded dropout offset.
  if (!recompute_core) {
    s.out = std::move(out);
    s.lse = std::move(lse);
    s.ctx = c;
  }
  return proj.forward(c, ctx);
}

Tensor SelfAttention::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  const cpu::AttnParams p = core_params(cfg, S, B, s);
  if (!s.out.defined()) {  // selective recomputation: the same kernel, inputs and dropout mask
    {
      ScopedOpTimer t(ctx.times, &OpTimes::attention);
      ops::attention_forward(p, s.q, s.k, s.v, s.out, s.lse);
    }
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.ctx = ops::heads_to_rows(s.out, S, B, Hq, D);
  }
  Tensor dctx = proj.backward(dy, s.ctx, ctx);
  s.ctx = Tensor();
  Tensor dout, dq, dk, dv, dx;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    dout = ops::rows_to_heads(dctx, S, B, Hq, D);
  }
  dctx = Tensor();
  {
    ScopedOpTimer t(ctx.times, &OpTimes::attention);
    ops::attention_backward(p, s.q, s.k, s.v, s.out, s.lse, dout, dq, dk, dv);
  }
  if (rope) {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::rope_backward(dq, rope->cos, rope->sin, rope->rot_dim);
    ops::rope_backward(dk, rope->cos, rope->sin, rope->rot_dim);
  }
  if (cfg.qk_layernorm) {
    dq = head_norm_backward(q_norm, dq, s.qn, ctx);
    dk = head_norm_backward(k_norm, dk, s.kn, ctx);
  }
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    dx = ops::qkv_merge(dq, dk, dv, S, B, G, qpg, D);
  }
  Tensor dxin = qkv.backward(dx, s.x, ctx);
  s = Saved{};
  return dxin;
}

}  // namespace mt::model
