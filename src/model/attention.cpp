#include "model/attention.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::model {

void RopeTables::build(int64_t seq, int64_t rd, double base) {
  rot_dim = rd;
  cos = Tensor::empty({seq, rd / 2});
  sin = Tensor::empty({seq, rd / 2});
  cpu::rope_tables(seq, rd, base, cos.data<float>(), sin.data<float>());
}

void SelfAttention::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c,
                          const RopeTables* r) {
  cfg = c;
  rope = r;
  qkv.build(ps, prefix + ".linear_qkv", c.hidden_size, c.qkv_out(), c.add_qkv_bias, Init::Normal);
  proj.build(ps, prefix + ".linear_proj", c.num_attention_heads * c.kv_channels, c.hidden_size, c.add_bias_linear,
             Init::ScaledNormal);
}

namespace {

// Layout changes between the packed [S*B, groups*(qpg+2)*D] projection and the per-head
// [B, H, S, D] tensors the attention kernel reads. `to_heads` true: packed -> heads.
void qkv_layout(float* packed, float* q, float* k, float* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
                bool to_heads) {
  const int64_t row = G * (qpg + 2) * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      float* pr = packed + (s * B + b) * row;
      for (int64_t g = 0; g < G; ++g) {
        float* pg = pr + g * (qpg + 2) * D;
        for (int64_t j = 0; j < qpg + 2; ++j) {
          float* head;
          if (j < qpg) {
            head = q + ((b * G * qpg + g * qpg + j) * S + s) * D;
          } else {
            float* base = j == qpg ? k : v;
            head = base + ((b * G + g) * S + s) * D;
          }
          float* src = pg + j * D;
          for (int64_t d = 0; d < D; ++d) {
            if (to_heads) head[d] = src[d];
            else src[d] = head[d];
          }
        }
      }
    }
  }
}

// [B, H, S, D] <-> [S*B, H*D]. `to_rows` true: heads -> rows.
void heads_rows(float* heads, float* rows, int64_t S, int64_t B, int64_t H, int64_t D, bool to_rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        float* r = rows + (s * B + b) * H * D + h * D;
        float* x = heads + ((b * H + h) * S + s) * D;
        for (int64_t d = 0; d < D; ++d) {
          if (to_rows) r[d] = x[d];
          else x[d] = r[d];
        }
      }
    }
  }
}

}  // namespace

Tensor SelfAttention::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  s.x = x;
  Tensor packed = qkv.forward(x, ctx);
  ScopedOpTimer t(ctx.times, &OpTimes::attention);
  s.q = Tensor::empty({B, Hq, S, D});
  s.k = Tensor::empty({B, G, S, D});
  s.v = Tensor::empty({B, G, S, D});
  qkv_layout(packed.data<float>(), s.q.data<float>(), s.k.data<float>(), s.v.data<float>(), S, B, G, qpg, D, true);
  if (rope) {
    cpu::rope_forward(s.q.data<float>(), rope->cos.data<float>(), rope->sin.data<float>(), B, Hq, S, D, rope->rot_dim);
    cpu::rope_forward(s.k.data<float>(), rope->cos.data<float>(), rope->sin.data<float>(), B, G, S, D, rope->rot_dim);
  }
  cpu::AttnParams p{B, Hq, G, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
  p.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
  if (p.dropout_p > 0.f) {
    p.seed = s.seed = ctx.rng->seed;
    p.offset = s.offset = ctx.dropout_offset(1);
  }
  s.out = Tensor::empty({B, Hq, S, D});
  s.lse = Tensor::empty({B, Hq, S});
  cpu::attention_forward(p, s.q.data<float>(), s.k.data<float>(), s.v.data<float>(), s.out.data<float>(),
                         s.lse.data<float>());
  s.ctx = Tensor::empty({S * B, Hq * D});
  heads_rows(s.out.data<float>(), s.ctx.data<float>(), S, B, Hq, D, true);
  return proj.forward(s.ctx, ctx);
}

Tensor SelfAttention::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  const int64_t G = cfg.num_query_groups, qpg = cfg.q_per_group(), D = cfg.kv_channels, Hq = cfg.num_attention_heads;
  Tensor dctx = proj.backward(dy, s.ctx, ctx);
  Tensor dx;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::attention);
    Tensor dout = Tensor::empty({B, Hq, S, D});
    heads_rows(dout.data<float>(), dctx.data<float>(), S, B, Hq, D, false);
    cpu::AttnParams p{B, Hq, G, S, D, 1.0f / std::sqrt(static_cast<float>(D))};
    p.dropout_p = ctx.training ? cfg.attention_dropout : 0.f;
    p.seed = s.seed;
    p.offset = s.offset;
    Tensor dq = Tensor::empty(s.q.shape()), dk = Tensor::empty(s.k.shape()), dv = Tensor::empty(s.v.shape());
    cpu::attention_backward(p, s.q.data<float>(), s.k.data<float>(), s.v.data<float>(), s.out.data<float>(),
                            s.lse.data<float>(), dout.data<float>(), dq.data<float>(), dk.data<float>(),
                            dv.data<float>());
    if (rope) {
      cpu::rope_backward(dq.data<float>(), rope->cos.data<float>(), rope->sin.data<float>(), B, Hq, S, D, rope->rot_dim);
      cpu::rope_backward(dk.data<float>(), rope->cos.data<float>(), rope->sin.data<float>(), B, G, S, D, rope->rot_dim);
    }
    dx = Tensor::empty({S * B, cfg.qkv_out()});
    qkv_layout(dx.data<float>(), dq.data<float>(), dk.data<float>(), dv.data<float>(), S, B, G, qpg, D, false);
  }
  Tensor dxin = qkv.backward(dx, s.x, ctx);
  s = Saved{};
  return dxin;
}

}  // namespace mt::model
