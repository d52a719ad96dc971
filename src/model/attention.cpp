#include "model/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"

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

void check_query_groups_tp(const TransformerConfig& c, int64_t tp) {
  const int64_t G = c.num_query_groups;
  if (tp <= 1 || G <= 0) return;
  const char* fix = "; change --tensor-model-parallel-size or the model shape";
  if (tp <= G) {
    if (G % tp != 0)
      fail("--num-query-groups ({}) must be divisible by --tensor-model-parallel-size ({}) (or, when smaller, divide "
           "it): Megatron gives each TP rank whole query groups{}",
           G, tp, fix);
    return;
  }
  if (tp % G != 0)
    fail("--tensor-model-parallel-size ({}) larger than --num-query-groups ({}) must be a multiple of it: Megatron "
         "replicates each key/value group on TP / groups ranks{}",
         tp, G, fix);
  const int64_t rep = tp / G, qpg = c.num_attention_heads / G;
  if (qpg % rep != 0)
    fail("--num-attention-heads ({}) / --num-query-groups ({}) = {} query heads per group must split evenly over the "
         "{} TP ranks (--tensor-model-parallel-size {} / --num-query-groups) that share each key/value group{}",
         c.num_attention_heads, G, qpg, rep, tp, fix);
  if ((qpg + 2) * c.kv_channels % rep != 0)
    fail("the fused QKV weight's {} rows per query group ((heads per group + 2) x --kv-channels {}) do not split over "
         "the {} TP ranks (--tensor-model-parallel-size {} / --num-query-groups {}) that share each group{}",
         (qpg + 2) * c.kv_channels, c.kv_channels, rep, tp, G, fix);
}

void SelfAttention::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c,
                          const RopeTables* r, const TensorParallel* t) {
  cfg = c;
  rope = r;
  tp = t;
  recompute_core = c.recomputes("core_attn");
  // Whole query groups go to each TP rank; linear_qkv packs per group [q heads; k; v], so a
  // rank's groups are one contiguous block of its rows, and its heads a contiguous block of
  // linear_proj's input columns.
  // With TP > groups (Megatron's KV replication) the weight is still split into TP contiguous
  // row blocks, which no longer align with groups: forward gathers the whole QKV activation and
  // keeps group tp_rank / (TP / groups) and this rank's H / TP query heads of it, which are heads
  // rank * H / TP onwards in the group-major order, the block linear_proj's row split gives it.
  const int n = t ? t->size() : 1;
  if (n > 1) check_query_groups_tp(c, n);
  shard.kv_replicas = n > c.num_query_groups ? n / c.num_query_groups : 1;
  shard.local_heads = c.num_attention_heads / n;
  shard.local_query_groups = shard.kv_replicas > 1 ? 1 : c.num_query_groups / n;
  qkv_gather = TPRegion(shard.kv_replicas > 1 ? TPMapping::Features : TPMapping::None, t);
  qkv.build(ps, prefix + ".linear_qkv", c.hidden_size, c.qkv_out(), c.add_qkv_bias, Init::Normal,
            ParallelMode::Column, t);
  proj.build(ps, prefix + ".linear_proj", c.num_attention_heads * c.kv_channels, c.hidden_size, c.add_bias_linear,
             Init::ScaledNormal, ParallelMode::Row, t);
  proj.input_kept_by_caller = true;  // the core's output: attention's backward reads it anyway
  if (c.qk_layernorm) {
    TransformerConfig hc = c;
    hc.hidden_size = c.kv_channels;
    q_norm.build(ps, prefix + ".q_layernorm", hc);
    k_norm.build(ps, prefix + ".k_layernorm", hc);
    // Shared by all heads, and each TP rank sees only its heads: the gradients are partial per
    // TP rank and are summed over TP like those of sequence-parallel norms. (Replicated K heads
    // each see a partial dK, so the sum over TP is again the full gradient.)
    const bool split = t && t->on();
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
ops::AttentionShape core_params(const AttentionShard& shard, int64_t D, int64_t S, int64_t B,
                            const SelfAttention::Saved& s) {
  ops::AttentionShape p{B, shard.local_heads, shard.local_query_groups, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
  p.dropout_p = s.dropout_p;
  p.seed = s.seed;
  p.offset = s.offset;
  if (s.seq) s.seq->describe(p);  // the whole sequence's length and its documents
  return p;
}

// Heads [h0, h0 + n) of a [B, H, S, D] tensor, copied (B contiguous runs; any device).
Tensor select_heads(const Tensor& x, int64_t h0, int64_t n) {
  const int64_t B = x.dim(0), H = x.dim(1), sd = x.dim(2) * x.dim(3);
  Tensor y = Tensor::empty({B, n, x.dim(2), x.dim(3)}, x.dtype(), x.device());
  for (int64_t b = 0; b < B; ++b) y.flat_range(b * n * sd, {n * sd}).copy_from(x.flat_range((b * H + h0) * sd, {n * sd}));
  return y;
}
// The reverse: x [B, n, S, D] placed at heads [h0, h0 + n) of a zero [B, H, S, D] tensor.
Tensor place_heads(const Tensor& x, int64_t H, int64_t h0) {
  const int64_t B = x.dim(0), n = x.dim(1), sd = x.dim(2) * x.dim(3);
  Tensor y = Tensor::zeros({B, H, x.dim(2), x.dim(3)}, x.dtype(), x.device());
  for (int64_t b = 0; b < B; ++b) y.flat_range((b * H + h0) * sd, {n * sd}).copy_from(x.flat_range(b * n * sd, {n * sd}));
  return y;
}
}  // namespace

ops::RopeRef SelfAttention::fused_rope(const SequenceLayout* seq) const {
  if (!rope || cfg.qk_layernorm || shard.kv_replicas > 1) return {};
  if (seq && seq->rope_cos.defined()) {
    // A table per sample (--reset-position-ids, micro-batch > 1): the GPU's fused split reads
    // one table for all samples, so rotate() runs it sample by sample instead.
    if (seq->rope_cos.ndim() == 3 && seq->rope_cos.device() != Device::CPU) return {};
    return {&seq->rope_cos, &seq->rope_sin, rope->rot_dim};
  }
  return {&rope->cos, &rope->sin, rope->rot_dim};
}

// The core's forward: out (in linear_proj's row layout) and lse from q, k, v; in backward
// again under selective recomputation, with the same inputs and dropout mask.
void SelfAttention::core_forward(const ops::AttentionShape& p, const Saved& s, Tensor& out_rows, Tensor& lse,
                                 PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::attention);
  if (!s.seq || !s.seq->cp) return ops::attention_forward_rows(p, s.q, s.k, s.v, out_rows, lse);
  Tensor out;
  cp_attention_forward(*s.seq->cp, p, s.q, s.k, s.v, out, lse);
  out_rows = ops::heads_to_rows(out, p.S, p.B, p.Hq, p.D);
}

void SelfAttention::core_backward(const ops::AttentionShape& p, const Saved& s, const Tensor& dout_rows, Tensor& dq,
                                  Tensor& dk, Tensor& dv) const {
  if (!s.seq || !s.seq->cp) return ops::attention_backward_rows(p, s.q, s.k, s.v, s.out, s.lse, dout_rows, dq, dk, dv);
  cp_attention_backward(*s.seq->cp, p, s.q, s.k, s.v, ops::rows_to_heads(s.out, p.S, p.B, p.Hq, p.D), s.lse,
                        ops::rows_to_heads(dout_rows, p.S, p.B, p.Hq, p.D), dq, dk, dv);
}

void SelfAttention::split_qkv(Tensor packed, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  const int64_t D = cfg.kv_channels;
  if (shard.kv_replicas == 1) {
    ops::qkv_split(packed, s.q, s.k, s.v, S, B, shard.local_query_groups, shard.local_q_per_group(), D,
                   fused_rope(s.seq.get()));
    return;
  }
  // This rank's columns of the group-interleaved QKV output do not align with groups: gather
  // them all, split by the model's groups, and keep group rank / replicas with this rank's
  // query heads (rank * local heads onwards, group-major), as Megatron does when groups < TP.
  packed = qkv_gather.forward(packed, ctx.times);
  Tensor q, k, v;
  ops::qkv_split(packed, q, k, v, S, B, cfg.num_query_groups, cfg.q_per_group(), D);
  const int64_t r = tp->rank(), g = r / shard.kv_replicas;
  s.q = select_heads(q, r * shard.local_heads, shard.local_heads);
  s.k = select_heads(k, g, 1);
  s.v = select_heads(v, g, 1);
}

Tensor SelfAttention::merge_qkv(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t S, int64_t B,
                                const SequenceLayout* seq, PassContext& ctx) const {
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  const int64_t D = cfg.kv_channels;
  if (shard.kv_replicas == 1)
    return ops::qkv_merge(dq, dk, dv, S, B, shard.local_query_groups, shard.local_q_per_group(), D, fused_rope(seq));
  // The gathered activation's gradient: this rank's q heads and its group's k, v, zeros
  // elsewhere; reduce-scattering it back to the local columns sums the K/V gradients of the
  // ranks sharing the group (and adds only zeros to the q heads).
  const int64_t r = tp->rank(), g = r / shard.kv_replicas, G = cfg.num_query_groups;
  const Tensor dx = ops::qkv_merge(place_heads(dq, cfg.num_attention_heads, r * shard.local_heads),
                                   place_heads(dk, G, g), place_heads(dv, G, g), S, B, G, cfg.q_per_group(), D);
  return qkv_gather.backward(dx, ctx.times);
}

void SelfAttention::rotate(Tensor& q, Tensor& k, bool backward, const SequenceLayout* seq, PassContext& ctx) const {
  ScopedOpTimer timer(ctx.times, &OpTimes::elementwise);
  const bool own = seq && seq->rope_cos.defined();
  const Tensor& cos = own ? seq->rope_cos : rope->cos;
  const Tensor& sin = own ? seq->rope_sin : rope->sin;
  if (cos.ndim() == 3 && q.device() != Device::CPU) {
    // Tables [B, S, rot/2], one per sample: each sample's heads [1, H, S, D] (a view) with its own.
    const int64_t B = q.dim(0), S = cos.dim(1), half = cos.dim(2);
    for (Tensor* t : {&q, &k}) {
      const int64_t per = t->numel() / B;
      for (int64_t b = 0; b < B; ++b) {
        Tensor x = t->flat_range(b * per, {1, t->dim(1), t->dim(2), t->dim(3)});
        const Tensor c = cos.flat_range(b * S * half, {S, half}), sn = sin.flat_range(b * S * half, {S, half});
        if (backward) ops::rope_backward(x, c, sn, rope->rot_dim);
        else ops::rope_forward(x, c, sn, rope->rot_dim);
      }
    }
    return;
  }
  for (Tensor* t : {&q, &k}) {
    if (backward) ops::rope_backward(*t, cos, sin, rope->rot_dim);
    else ops::rope_forward(*t, cos, sin, rope->rot_dim);
  }
}

Tensor SelfAttention::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx,
                              const Tensor* residual, const Tensor* x_amax) const {
  s.x = qkv.keeps_input(x, ctx) ? Tensor() : x;  // else linear_qkv keeps its FP8 codes
  s.seq = ctx.seq;
  split_qkv(qkv.forward(x, ctx, nullptr, x_amax), S, B, s, ctx);
  if (cfg.qk_layernorm) {
    s.q = head_norm_forward(q_norm, s.q, s.qn, ctx);
    s.k = head_norm_forward(k_norm, s.k, s.kn, ctx);
  }
  if (rope && !fused_rope(s.seq.get()).rot_dim) rotate(s.q, s.k, false, s.seq.get(), ctx);
  s.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
  if (s.dropout_p > 0.f) {
    RngState* rng = ctx.region_rng(true);  // a TP region: each rank's heads get their own masks
    s.seed = rng->seed;
    s.offset = rng->next_offset(1);
  }
  // The core writes its output in linear_proj's row layout (in place where cuDNN runs it).
  Tensor out, lse;
  core_forward(core_params(shard, cfg.kv_channels, S, B, s), s, out, lse, ctx);
  // Selective recomputation drops the core's outputs (out and lse); backward rebuilds them from
  // q, k, v and the recorded dropout offset.
  if (!recompute_core) {
    s.out = out;
    s.lse = std::move(lse);
  }
  return proj.forward(out, ctx, residual);
}

Tensor SelfAttention::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const ops::AttentionShape p = core_params(shard, cfg.kv_channels, S, B, s);
  if (!s.out.defined()) core_forward(p, s, s.out, s.lse, ctx);  // selective recomputation
  Tensor dctx = proj.backward(dy, s.out, ctx);  // both in the row layout, as the core reads them
  Tensor dq, dk, dv;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::attention);
    core_backward(p, s, dctx, dq, dk, dv);
  }
  dctx = Tensor();
  if (rope && !fused_rope(s.seq.get()).rot_dim) rotate(dq, dk, true, s.seq.get(), ctx);
  if (cfg.qk_layernorm) {
    dq = head_norm_backward(q_norm, dq, s.qn, ctx);
    dk = head_norm_backward(k_norm, dk, s.kn, ctx);
  }
  Tensor dxin = qkv.backward(merge_qkv(dq, dk, dv, S, B, s.seq.get(), ctx), s.x, ctx);
  s = Saved{};
  return dxin;
}

}  // namespace mt::model
