// The CPU implementation of the Tensor ops (ops::host, see ops.def): fp32 tensors, with output
// allocation and shape bookkeeping around the reference kernels of kernels/cpu/ops.h.
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {
namespace {

// CPU tensors run the fp32 reference kernels.
void require_cpu_f32(const Tensor& t, const char* op) {
  MT_CHECK(t.device() == Device::CPU && t.dtype() == DType::F32, "{}: expected a CPU float32 tensor", op);
}
float* f(const Tensor& t) { return t.data<float>(); }

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor* b) {
  require_cpu_f32(x, "linear_forward");
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor y = Tensor::empty({rows, out});
  cpu::linear_forward(f(x), f(w), b ? f(*b) : nullptr, f(y), rows, out, in);
  return y;
}

Tensor linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& residual) {
  require_cpu_f32(residual, "linear_forward_residual");
  Tensor y = linear_forward(x, w, b);
  add_inplace(y, residual);
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db, bool need_dx,
                       bool accumulate_dw) {
  require_cpu_f32(dy, "linear_backward");
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor dx = need_dx ? Tensor::empty({rows, in}) : Tensor();
  if (!accumulate_dw) dw.zero_();  // the reference accumulates: from zero, that is the overwrite
  cpu::linear_backward(f(dy), f(x), f(w), need_dx ? f(dx) : nullptr, f(dw), db ? f(*db) : nullptr, rows, out, in);
  return dx;
}

void linear_forward_into(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y) {
  require_cpu_f32(x, "linear_forward_into");
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  MT_CHECK(y.numel() == rows * out, "linear_forward_into: output of {} elements for {} x {}", y.numel(), rows, out);
  cpu::linear_forward(f(x), f(w), b ? f(*b) : nullptr, f(y), rows, out, in);
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  require_cpu_f32(dy, "linear_backward_data");
  const int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
  Tensor dx = Tensor::empty({rows, in});
  cpu::linear_backward(f(dy), nullptr, f(w), f(dx), nullptr, nullptr, rows, out, in);
  return dx;
}

void linear_backward_data_into(const Tensor& dy, const Tensor& w, Tensor& dx) {
  require_cpu_f32(dy, "linear_backward_data_into");
  const int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
  MT_CHECK(dx.numel() == rows * in, "linear_backward_data_into: output of {} elements for {} x {}", dx.numel(), rows, in);
  cpu::linear_backward(f(dy), nullptr, f(w), f(dx), nullptr, nullptr, rows, out, in);
}

void grouped_linear_forward(const Tensor& x, const std::vector<const Tensor*>& w, const std::vector<int64_t>& counts,
                            Tensor& y) {
  int64_t off = 0;
  for (size_t g = 0; g < w.size(); ++g) {
    if (counts[g] > 0) {
      Tensor rows = y.slice(off, counts[g]);
      linear_forward_into(x.slice(off, counts[g]), *w[g], nullptr, rows);
    }
    off += counts[g];
  }
}

void grouped_linear_backward(const Tensor& dy, const Tensor& x, const std::vector<const Tensor*>& w,
                             const std::vector<Tensor*>& dw, const std::vector<int64_t>& counts,
                             const std::vector<bool>& accumulate_dw, Tensor& dx,
                             bool /*defer_wgrad: the CPU finishes everything before it returns*/) {
  MT_CHECK(accumulate_dw.size() == counts.size(), "grouped_linear_backward: {} accumulate flags for {} groups",
           accumulate_dw.size(), counts.size());
  int64_t off = 0;
  for (size_t g = 0; g < w.size(); ++g) {
    if (counts[g] > 0) {
      const Tensor dy_rows = dy.slice(off, counts[g]);
      Tensor dx_rows = dx.slice(off, counts[g]);
      linear_backward_data_into(dy_rows, *w[g], dx_rows);
      linear_backward_weight(dy_rows, x.slice(off, counts[g]), *dw[g], nullptr, accumulate_dw[g]);
    }
    off += counts[g];
  }
}

void join_deferred_work(Device) {}  // nothing is ever left running on the CPU

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor* db, bool accumulate_dw) {
  require_cpu_f32(dy, "linear_backward_weight");
  const int64_t out = dw.dim(0), in = dw.dim(1), rows = x.numel() / in;
  if (!accumulate_dw) dw.zero_();
  cpu::linear_backward(f(dy), f(x), nullptr, nullptr, f(dw), db ? f(*db) : nullptr, rows, out, in);
}

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), h = table.dim(1);
  Tensor y = Tensor::empty({n, h});
  cpu::embedding_forward(ids.data<int32_t>(), f(table), f(y), n, h);
  return y;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  cpu::embedding_backward(ids.data<int32_t>(), f(dout), f(dtable), ids.numel(), dtable.dim(1));
}

void add_position_embedding(Tensor& x, const Tensor& pe, int64_t S, int64_t B) {
  const int64_t h = pe.dim(1);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) cpu::add_inplace(f(x) + (s * B + b) * h, f(pe) + s * h, h);
}

void position_embedding_backward(const Tensor& dx, Tensor& dpe, int64_t S, int64_t B) {
  const int64_t h = dpe.dim(1);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) cpu::add_inplace(f(dpe) + s * h, f(dx) + (s * B + b) * h, h);
}

Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd, Tensor* amax) {
  require_cpu_f32(x, "rmsnorm_forward");
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = Tensor::empty({rows, dim});
  rstd = Tensor::empty({rows});
  cpu::rmsnorm_forward(f(x), f(w), f(y), f(rstd), rows, dim, eps);
  if (amax) fp8_amax(y, *amax);  // the GPU's fused amax, composed
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dw,
                        const Tensor* dx_add) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = Tensor::empty({rows, dim});
  cpu::rmsnorm_backward(f(dy), f(x), f(w), f(rstd), f(dx), f(dw), rows, dim);
  if (dx_add) add_inplace(dx, *dx_add);
  return dx;
}

Tensor layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& mean, Tensor& rstd) {
  require_cpu_f32(x, "layernorm_forward");
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = Tensor::empty({rows, dim});
  mean = Tensor::empty({rows});
  rstd = Tensor::empty({rows});
  cpu::layernorm_forward(f(x), f(w), f(b), f(y), f(mean), f(rstd), rows, dim, eps);
  return y;
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dw, Tensor& db, const Tensor* dx_add) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = Tensor::empty({rows, dim});
  cpu::layernorm_backward(f(dy), f(x), f(w), f(mean), f(rstd), f(dx), f(dw), f(db), rows, dim);
  if (dx_add) add_inplace(dx, *dx_add);
  return dx;
}

// CPU: the add, then the norm of the (fp32) sum; the model rounds the sum itself where it
// emulates half storage on the CPU, and then calls the unfused pair.
Tensor add_rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& rstd,
                           Tensor& sum, Tensor* amax) {
  sum = x.clone();
  add_inplace(sum, residual);
  return rmsnorm_forward(sum, w, eps, rstd, amax);
}

Tensor add_layernorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, float eps,
                             Tensor& mean, Tensor& rstd, Tensor& sum) {
  sum = x.clone();
  add_inplace(sum, residual);
  return layernorm_forward(sum, w, b, eps, mean, rstd);
}

namespace {
// One loop for both directions of the QKV (un)packing, so the two can never disagree.
void qkv_copy(float* packed, float* q, float* k, float* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
              bool to_heads) {
  const int64_t row = G * (qpg + 2) * D;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      float* pr = packed + (s * B + b) * row;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t j = 0; j < qpg + 2; ++j) {
          float* head =
              j < qpg ? q + ((b * G * qpg + g * qpg + j) * S + s) * D : (j == qpg ? k : v) + ((b * G + g) * S + s) * D;
          float* src = pr + (g * (qpg + 2) + j) * D;
          for (int64_t d = 0; d < D; ++d) {
            if (to_heads)
              head[d] = src[d];
            else
              src[d] = head[d];
          }
        }
      }
    }
  }
}

void heads_rows_copy(float* heads, float* rows, int64_t S, int64_t B, int64_t H, int64_t D, bool to_rows) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        float* r = rows + (s * B + b) * H * D + h * D;
        float* x = heads + ((b * H + h) * S + s) * D;
        for (int64_t d = 0; d < D; ++d) {
          if (to_rows)
            r[d] = x[d];
          else
            x[d] = r[d];
        }
      }
    }
  }
}
}  // namespace

void qkv_split(const Tensor& packed, Tensor& q, Tensor& k, Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, const RopeRef& rope) {
  q = Tensor::empty({B, G * qpg, S, D});
  k = Tensor::empty({B, G, S, D});
  v = Tensor::empty({B, G, S, D});
  qkv_copy(f(packed), f(q), f(k), f(v), S, B, G, qpg, D, true);
  if (rope.rot_dim > 0) {
    rope_forward(q, *rope.cos, *rope.sin, rope.rot_dim);
    rope_forward(k, *rope.cos, *rope.sin, rope.rot_dim);
  }
}

Tensor qkv_merge(const Tensor& q, const Tensor& k, const Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
                 int64_t D, const RopeRef& rope) {
  if (rope.rot_dim > 0) {  // in place: tensors share storage, so the caller's q and k turn
    Tensor dq = q, dk = k;
    rope_backward(dq, *rope.cos, *rope.sin, rope.rot_dim);
    rope_backward(dk, *rope.cos, *rope.sin, rope.rot_dim);
  }
  Tensor packed = Tensor::empty({S * B, G * (qpg + 2) * D});
  qkv_copy(f(packed), f(q), f(k), f(v), S, B, G, qpg, D, false);
  return packed;
}

Tensor heads_to_rows(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor r = Tensor::empty({S * B, H * D});
  heads_rows_copy(f(x), f(r), S, B, H, D, true);
  return r;
}

Tensor rows_to_heads(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor h = Tensor::empty({B, H, S, D});
  heads_rows_copy(f(h), f(x), S, B, H, D, false);
  return h;
}

namespace {
// Tables [B, S, rot/2] hold every sample's own positions (packed documents); [>= S, rot/2]
// tables are shared by the samples.
bool per_sample_tables(const Tensor& x, const Tensor& cos) {
  const bool per = cos.ndim() == 3;
  MT_CHECK(per ? cos.dim(0) == x.dim(0) && cos.dim(1) == x.dim(2) : cos.dim(0) >= x.dim(2),
           "RoPE tables {} for {} samples of {} positions", cos.shape_str(), x.dim(0), x.dim(2));
  return per;
}
}  // namespace

void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  cpu::rope_forward(f(x), f(cos), f(sin), x.dim(0), x.dim(1), x.dim(2), x.dim(3), rot_dim, per_sample_tables(x, cos));
}

void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  cpu::rope_backward(f(dx), f(cos), f(sin), dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3), rot_dim,
                     per_sample_tables(dx, cos));
}

void attention_forward(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse) {
  out = Tensor::empty(q.shape());
  lse = Tensor::empty({p.B, p.Hq, p.S});
  cpu::attention_forward(p, f(q), f(k), f(v), f(out), f(lse));
}

void attention_backward(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  dq = Tensor::empty(q.shape());
  dk = Tensor::empty(k.shape());
  dv = Tensor::empty(v.shape());
  cpu::attention_backward(p, f(q), f(k), f(v), f(out), f(lse), f(dout), f(dq), f(dk), f(dv));
}

// The CPU has no direct path: the rows ops run the composition.
bool attention_forward_rows_direct(const AttentionShape&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                                   Tensor&) {
  return false;
}

bool attention_backward_rows_direct(const AttentionShape&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&) {
  return false;
}

void copy_into(Tensor& dst, const Tensor& src) {
  MT_CHECK(src.device() == Device::CPU && dst.device() == Device::CPU, "copy_into: expected CPU tensors");
  dst.copy_from(src);
}

// With amax: the reference of the GPU's fused pass, the op then fp8_amax of its output.
Tensor swiglu_forward(const Tensor& h, Tensor* amax) {
  const int64_t rows = h.dim(0), F = h.dim(1) / 2;
  Tensor y = Tensor::empty({rows, F});
  cpu::swiglu_forward(f(h), f(y), rows, F);
  if (amax) fp8_amax(y, *amax);
  return y;
}

Tensor swiglu_backward(const Tensor& dy, const Tensor& h, Tensor* amax) {
  Tensor dh = Tensor::empty(h.shape());
  cpu::swiglu_backward(f(dy), f(h), f(dh), h.dim(0), h.dim(1) / 2);
  if (amax) fp8_amax(dh, *amax);
  return dh;
}

Tensor gelu_forward(const Tensor& h, bool tanh_approx) {
  Tensor y = Tensor::empty(h.shape());
  cpu::gelu_forward(f(h), f(y), h.numel(), tanh_approx);
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& h, bool tanh_approx) {
  Tensor dh = Tensor::empty(h.shape());
  cpu::gelu_backward(f(dy), f(h), f(dh), h.numel(), tanh_approx);
  return dh;
}

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  Tensor y = Tensor::empty(x.shape());
  cpu::dropout_forward(f(x), f(y), x.numel(), p, seed, offset);
  return y;
}

Tensor dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset) {
  Tensor dx = Tensor::empty(dy.shape());
  cpu::dropout_backward(f(dy), f(dx), dy.numel(), p, seed, offset);
  return dx;
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  losses = Tensor::empty({N});
  lse = Tensor::empty({N});
  cpu::cross_entropy_forward(f(logits), targets.data<int32_t>(), f(losses), f(lse), N, V, V);
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  Tensor d = Tensor::empty({N, V});
  cpu::cross_entropy_backward(f(logits), targets.data<int32_t>(), f(lse), f(dloss), f(d), N, V, V);
  return d;
}

Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& dloss, Tensor& losses,
                           Tensor& lse) {
  cross_entropy_forward(logits, targets, losses, lse);
  return cross_entropy_backward(logits, targets, lse, dloss);
}

void add_inplace(Tensor& y, const Tensor& x) {
  MT_CHECK(y.numel() == x.numel(), "add_inplace: {} vs {}", y.shape_str(), x.shape_str());
  cpu::add_inplace(f(y), f(x), y.numel());
}

void cast(const Tensor& src, Tensor& dst) { dst.copy_from(src); }

void round_bf16_inplace(Tensor& x) {
  float* d = f(x);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = round_bf16(d[i]);
}

void round_f16_inplace(Tensor& x) {
  float* d = f(x);
  const int64_t n = x.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = round_f16(d[i]);
}

}  // namespace mt::ops::host
