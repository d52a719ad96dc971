// The CUDA implementation of the Tensor ops (ops::gpu, see ops.def): shape bookkeeping and output
// allocation around the launchers of ops_cuda.h and layout.h, all on the live context's compute
// stream. Each op picks the launcher's instantiation from the dtype of its main input.
#include <cuda_runtime_api.h>

#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/layout.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {
namespace {

cudaStream_t st() { return cuda::compute_stream(); }
cuda::Gemm& gemm() { return *cuda::context().gemm; }

// Activations and compute copies are stored in half precision: bf16 (--bf16) or IEEE fp16
// (--fp16), chosen by the model and seen here as the tensors' dtype. Every op dispatches on the
// dtype of its main input (with_half) and checks that the other half tensors agree (h<T>); the
// kernels are the same templates instantiated for both types.
using bf16 = cuda::bf16;
using f16 = cuda::f16;
template <typename T>
constexpr DType half_dtype() {
  return std::is_same_v<T, f16> ? DType::F16 : DType::BF16;
}
template <typename T>
T* h(const Tensor& t) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  MT_CHECK(t.dtype() == half_dtype<T>() && t.device() == Device::CUDA, "expected a CUDA {} tensor, got {} {}",
           dtype_name(half_dtype<T>()), dtype_name(t.dtype()), t.shape_str());
  return t.data<T>();
}
float* f(const Tensor& t) {
  MT_CHECK(t.dtype() == DType::F32 && t.device() == Device::CUDA, "expected a CUDA f32 tensor, got {} {}",
           dtype_name(t.dtype()), t.shape_str());
  return t.data<float>();
}
// Calls fn with a null pointer of t's half type (bf16* or f16*): fn is a template lambda
// `[&]<typename T>(T*) { ... h<T>(x) ... }` whose T picks the launchers' instantiation.
template <typename F>
decltype(auto) with_half(const Tensor& t, F&& fn) {
  if (t.dtype() == DType::F16) return fn(static_cast<f16*>(nullptr));
  MT_CHECK(t.dtype() == DType::BF16 && t.device() == Device::CUDA,
           "expected a CUDA bf16 or fp16 tensor, got {} {} on {}", dtype_name(t.dtype()), t.shape_str(),
           t.device() == Device::CPU ? "the CPU" : "the GPU");
  return fn(static_cast<bf16*>(nullptr));
}
// A half tensor of the same dtype as `like`.
Tensor act(const Shape& s, const Tensor& like) { return Tensor::empty(s, like.dtype(), Device::CUDA); }
Tensor stat(const Shape& s) { return Tensor::empty(s, DType::F32, Device::CUDA); }
// An optional FP8 amax output (f32 [1]) of a producer op, or null.
float* amax_out(Tensor* a, const char* what) {
  if (!a) return nullptr;
  MT_CHECK(a->numel() == 1, "{}: amax must be f32 [1], got {}", what, a->shape_str());
  return f(*a);
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor y = act({rows, out}, x);
  with_half(x, [&]<typename T>(T*) {
    cuda::linear_forward(gemm(), h<T>(x), h<T>(w), bias ? h<T>(*bias) : nullptr, h<T>(y), rows, out, in, st());
  });
  return y;
}

// The residual is the GEMM's C (beta = 1), y its D: h<T> checks that it has x's half type.
Tensor linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  MT_CHECK(residual.numel() == rows * out, "linear_forward_residual: residual {} for a {} x {} output",
           residual.shape_str(), rows, out);
  Tensor y = act({rows, out}, x);
  with_half(x, [&]<typename T>(T*) {
    cuda::linear_forward_residual(gemm(), h<T>(x), h<T>(w), bias ? h<T>(*bias) : nullptr, h<T>(residual), h<T>(y),
                                  rows, out, in, st());
  });
  return y;
}

// One GEMV kernel where it applies and takes the fusions, else the composition (as the CPU's).
Tensor fused_linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const LinearFusion& f) {
  MT_CHECK(!(f.swiglu && f.residual), "fused_linear_forward: a residual is not added after SwiGLU");
  MT_CHECK(!f.norm_weight || f.norm_weight->numel() == w.dim(1), "fused_linear_forward: a norm scale of {} for {} inputs",
           f.norm_weight ? f.norm_weight->numel() : 0, w.dim(1));
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  const void* gamma = f.norm_weight ? f.norm_weight->raw() : nullptr;
  if (cuda::gemv_applies(rows) && x.dtype() != DType::F32 && w.dtype() == x.dtype() &&
      cuda::gemv_fusable(x.raw(), w.raw(), gamma, rows, in) && (!f.swiglu || out % 2 == 0)) {
    Tensor y = act({rows, f.swiglu ? out / 2 : out}, x);
    with_half(x, [&]<typename T>(T*) {
      const cuda::GemvFusion gf{f.norm_weight ? h<T>(*f.norm_weight) : nullptr, f.norm_eps, f.swiglu};
      cuda::gemv_forward(h<T>(x), h<T>(w), bias ? h<T>(*bias) : nullptr, f.residual ? h<T>(*f.residual) : nullptr,
                         h<T>(y), rows, out, in, st(), gf);
    });
    return y;
  }
  return fused_linear_composed(x, w, bias, f);
}

// The whole of it in the GEMV where its kernel takes it (gemv.cu, GemvQkvOut), else the two ops.
Tensor fused_qkv_forward(const Tensor& x, const Tensor& w, const Tensor* bias, const LinearFusion& lf, Tensor& k_cache,
                         Tensor& v_cache, const Tensor& slot, const Tensor& pos, int64_t G, int64_t qpg, int64_t D,
                         const RopeRef& rope) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  const void* gamma = lf.norm_weight ? lf.norm_weight->raw() : nullptr;
  const bool whole_heads = rope.rot_dim == 0 || rope.rot_dim == D;  // RoPE partners half a head apart
  if (cuda::gemv_applies(rows) && x.dtype() != DType::F32 && w.dtype() == x.dtype() &&
      k_cache.dtype() == x.dtype() && cuda::gemv_fusable(x.raw(), w.raw(), gamma, rows, in) && whole_heads &&
      D % 2 == 0 && out == G * (qpg + 2) * D && !lf.swiglu && !lf.residual) {
    MT_CHECK(k_cache.ndim() == 4 && k_cache.dim(1) == G && k_cache.dim(3) == D && v_cache.shape() == k_cache.shape() &&
                 v_cache.dtype() == k_cache.dtype(),
             "fused_qkv_forward: caches {} / {} for {} groups of {}", k_cache.shape_str(), v_cache.shape_str(), G, D);
    MT_CHECK(slot.dtype() == DType::I32 && pos.dtype() == DType::I32 && slot.numel() == rows &&
                 pos.numel() == rows && slot.device() == Device::CUDA && pos.device() == Device::CUDA,
             "fused_qkv_forward: slot and pos must be CUDA i32 [{}]", rows);
    MT_CHECK(rope.rot_dim == 0 || (rope.cos->numel() == rows * D / 2 && rope.sin->numel() == rows * D / 2),
             "fused_qkv_forward: RoPE tables of {} rows x {} expected", rows, D / 2);
    Tensor q = act({1, G * qpg, rows, D}, x);
    with_half(x, [&]<typename T>(T*) {
      const cuda::GemvQkvOut o{h<T>(q),
                               h<T>(k_cache),
                               h<T>(v_cache),
                               slot.data<int32_t>(),
                               pos.data<int32_t>(),
                               rope.rot_dim ? f(*rope.cos) : nullptr,
                               rope.rot_dim ? f(*rope.sin) : nullptr,
                               static_cast<int>(G),
                               static_cast<int>(qpg),
                               static_cast<int>(D),
                               k_cache.dim(0),
                               k_cache.dim(2)};
      const cuda::GemvFusion gf{lf.norm_weight ? h<T>(*lf.norm_weight) : nullptr, lf.norm_eps, false, &o};
      cuda::gemv_forward(h<T>(x), h<T>(w), bias ? h<T>(*bias) : nullptr, nullptr, h<T>(q), rows, out, in, st(), gf);
    });
    return q;
  }
  return fused_qkv_composed(x, w, bias, lf, k_cache, v_cache, slot, pos, G, qpg, D, rope);
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db, bool need_dx,
                       bool accumulate_dw) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor dx = need_dx ? act({rows, in}, dy) : Tensor();
  with_half(dy, [&]<typename T>(T*) {
    cuda::linear_backward(gemm(), h<T>(dy), h<T>(x), h<T>(w), need_dx ? h<T>(dx) : nullptr, f(dw),
                          db ? f(*db) : nullptr, rows, out, in, st(), accumulate_dw);
  });
  return dx;
}

void linear_forward_into(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  MT_CHECK(y.numel() == rows * out && y.dtype() == x.dtype(), "linear_forward_into: {} output of {} x {} expected",
           dtype_name(x.dtype()), rows, out);
  with_half(x, [&]<typename T>(T*) {
    cuda::linear_forward(gemm(), h<T>(x), h<T>(w), bias ? h<T>(*bias) : nullptr, h<T>(y), rows, out, in, st());
  });
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
  Tensor dx = act({rows, in}, dy);
  with_half(dy, [&]<typename T>(T*) {
    cuda::linear_backward(gemm(), h<T>(dy), nullptr, h<T>(w), h<T>(dx), nullptr, nullptr, rows, out, in, st());
  });
  return dx;
}

void linear_backward_data_into(const Tensor& dy, const Tensor& w, Tensor& dx) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
  MT_CHECK(dx.numel() == rows * in && dx.dtype() == dy.dtype(), "linear_backward_data_into: {} output of {} x {} expected",
           dtype_name(dy.dtype()), rows, in);
  with_half(dy, [&]<typename T>(T*) {
    cuda::linear_backward(gemm(), h<T>(dy), nullptr, h<T>(w), h<T>(dx), nullptr, nullptr, rows, out, in, st());
  });
}

// The groups' GEMMs spread over the context's side streams (round robin), which start after the
// compute stream's work so far and which the compute stream waits for at the end.
void grouped_linear_forward(const Tensor& x, const std::vector<const Tensor*>& w, const std::vector<int64_t>& counts,
                            Tensor& y) {
  MT_CHECK(w.size() == counts.size(), "grouped_linear_forward: {} weights for {} groups", w.size(), counts.size());
  cuda::SideStreams side(st());
  with_half(x, [&]<typename T>(T*) {
    int64_t off = 0;
    for (size_t g = 0; g < w.size(); ++g) {
      const int64_t out = w[g]->dim(0), in = w[g]->dim(1), n = counts[g];
      if (n > 0)
        cuda::linear_forward(gemm(), h<T>(x) + off * in, h<T>(*w[g]), static_cast<T*>(nullptr), h<T>(y) + off * out,
                             n, out, in, side.next());
      off += n;
    }
  });
}

void grouped_linear_backward(const Tensor& dy, const Tensor& x, const std::vector<const Tensor*>& w,
                             const std::vector<Tensor*>& dw, const std::vector<int64_t>& counts,
                             const std::vector<bool>& accumulate_dw, Tensor& dx, bool defer_wgrad) {
  MT_CHECK(w.size() == counts.size() && dw.size() == counts.size() && accumulate_dw.size() == counts.size(),
           "grouped_linear_backward: {} weights, {} gradients and {} accumulate flags for {} groups", w.size(),
           dw.size(), accumulate_dw.size(), counts.size());
  with_half(dy, [&]<typename T>(T*) {
    if (!defer_wgrad) {
      cuda::SideStreams side(st());
      int64_t off = 0;
      for (size_t g = 0; g < w.size(); ++g) {
        const int64_t out = w[g]->dim(0), in = w[g]->dim(1), n = counts[g];
        if (n > 0)
          cuda::linear_backward(gemm(), h<T>(dy) + off * out, h<T>(x) + off * in, h<T>(*w[g]), h<T>(dx) + off * in,
                                f(*dw[g]), nullptr, n, out, in, side.next(), accumulate_dw[g]);
        off += n;
      }
      return;
    }
    {  // the data gradients, which the compute stream needs next
      cuda::SideStreams side(st());
      int64_t off = 0;
      for (size_t g = 0; g < w.size(); ++g) {
        const int64_t out = w[g]->dim(0), in = w[g]->dim(1), n = counts[g];
        if (n > 0)
          cuda::linear_backward(gemm(), h<T>(dy) + off * out, static_cast<const T*>(nullptr), h<T>(*w[g]),
                                h<T>(dx) + off * in, nullptr, nullptr, n, out, in, side.next());
        off += n;
      }
    }
    // The weight gradients (the same GEMMs and bits as above), left running until
    // join_deferred_work; dy and x stay allocated until then.
    cuda::SideStreams side(st(), cuda::SideStreams::Join::Deferred);
    int64_t off = 0;
    for (size_t g = 0; g < w.size(); ++g) {
      const int64_t out = w[g]->dim(0), in = w[g]->dim(1), n = counts[g];
      if (n > 0)
        cuda::linear_backward(gemm(), h<T>(dy) + off * out, h<T>(x) + off * in, static_cast<const T*>(nullptr),
                              static_cast<T*>(nullptr), f(*dw[g]), nullptr, n, out, in, side.next(), accumulate_dw[g]);
      off += n;
    }
  });
  if (defer_wgrad) {
    cuda::keep_until_joined(std::make_shared<const Tensor>(dy));
    cuda::keep_until_joined(std::make_shared<const Tensor>(x));
  }
}

void join_deferred_work(Device) { cuda::join_deferred(st()); }

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor* db, bool accumulate_dw) {
  const int64_t out = dw.dim(0), in = dw.dim(1), rows = x.numel() / in;
  with_half(dy, [&]<typename T>(T*) {
    cuda::linear_backward(gemm(), h<T>(dy), h<T>(x), nullptr, nullptr, f(dw), db ? f(*db) : nullptr, rows, out, in,
                          st(), accumulate_dw);
  });
}

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), hd = table.dim(1);
  Tensor y = act({n, hd}, table);
  with_half(table, [&]<typename T>(T*) {
    cuda::embedding_forward(ids.data<int32_t>(), h<T>(table), h<T>(y), n, hd, st());
  });
  return y;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  with_half(dout, [&]<typename T>(T*) {
    cuda::embedding_backward(ids.data<int32_t>(), h<T>(dout), f(dtable), ids.numel(), dtable.dim(1), st());
  });
}

void add_position_embedding(Tensor& x, const Tensor& pe, int64_t S, int64_t B) {
  with_half(x, [&]<typename T>(T*) {
    cuda::add_position_embedding(h<T>(x), h<T>(pe), S, B, pe.dim(1), st());
  });
}

void position_embedding_backward(const Tensor& dx, Tensor& dpe, int64_t S, int64_t B) {
  with_half(dx, [&]<typename T>(T*) {
    cuda::position_embedding_backward(h<T>(dx), f(dpe), S, B, dpe.dim(1), st());
  });
}

Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd, Tensor* amax) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim}, x);
  rstd = stat({rows});
  float* a = amax_out(amax, "rmsnorm_forward");
  with_half(x, [&]<typename T>(T*) {
    cuda::rmsnorm_forward(h<T>(x), h<T>(w), h<T>(y), f(rstd), rows, dim, eps, st(), a);
  });
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dw,
                        const Tensor* dx_add) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = act({rows, dim}, dy);
  with_half(dy, [&]<typename T>(T*) {
    cuda::rmsnorm_backward(h<T>(dy), h<T>(x), h<T>(w), f(rstd), h<T>(dx), f(dw), rows, dim, st(),
                           dx_add ? h<T>(*dx_add) : nullptr);
  });
  return dx;
}

Tensor add_rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& rstd,
                           Tensor& sum, Tensor* amax) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim}, x);
  sum = act({rows, dim}, x);
  rstd = stat({rows});
  float* a = amax_out(amax, "add_rmsnorm_forward");
  with_half(x, [&]<typename T>(T*) {
    cuda::add_rmsnorm_forward(h<T>(x), h<T>(residual), h<T>(sum), h<T>(w), h<T>(y), f(rstd), rows, dim, eps, st(),
                              a);
  });
  return y;
}

Tensor layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& bias, float eps, Tensor& mean, Tensor& rstd) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim}, x);
  mean = stat({rows});
  rstd = stat({rows});
  with_half(x, [&]<typename T>(T*) {
    cuda::layernorm_forward(h<T>(x), h<T>(w), h<T>(bias), h<T>(y), f(mean), f(rstd), rows, dim, eps, st());
  });
  return y;
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dw, Tensor& db, const Tensor* dx_add) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = act({rows, dim}, dy);
  with_half(dy, [&]<typename T>(T*) {
    cuda::layernorm_backward(h<T>(dy), h<T>(x), h<T>(w), f(mean), f(rstd), h<T>(dx), f(dw), f(db), rows, dim, st(),
                             dx_add ? h<T>(*dx_add) : nullptr);
  });
  return dx;
}

Tensor add_layernorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& bias, float eps,
                             Tensor& mean, Tensor& rstd, Tensor& sum) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim}, x);
  sum = act({rows, dim}, x);
  mean = stat({rows});
  rstd = stat({rows});
  with_half(x, [&]<typename T>(T*) {
    cuda::add_layernorm_forward(h<T>(x), h<T>(residual), h<T>(sum), h<T>(w), h<T>(bias), h<T>(y), f(mean), f(rstd),
                                rows, dim, eps, st());
  });
  return y;
}

namespace {
cuda::RopeArgs rope_args(const RopeRef& r) {
  if (r.rot_dim <= 0) return {};
  return {f(*r.cos), f(*r.sin), r.rot_dim};
}
}  // namespace

void qkv_split(const Tensor& packed, Tensor& q, Tensor& k, Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, const RopeRef& rope) {
  q = act({B, G * qpg, S, D}, packed);
  k = act({B, G, S, D}, packed);
  v = act({B, G, S, D}, packed);
  with_half(packed, [&]<typename T>(T*) {
    cuda::qkv_split(h<T>(packed), h<T>(q), h<T>(k), h<T>(v), S, B, G, qpg, D, rope_args(rope), st());
  });
}

Tensor qkv_split_to_cache(const Tensor& packed, Tensor& k_cache, Tensor& v_cache, const Tensor& slot,
                          const Tensor& pos, int64_t G, int64_t qpg, int64_t D, const RopeRef& rope) {
  MT_CHECK(k_cache.ndim() == 4 && k_cache.dim(1) == G && k_cache.dim(3) == D && v_cache.shape() == k_cache.shape(),
           "qkv_split_to_cache: caches {} / {} for {} groups of {}", k_cache.shape_str(), v_cache.shape_str(), G, D);
  const int64_t N = packed.numel() / (G * (qpg + 2) * D);
  Tensor q = act({1, G * qpg, N, D}, packed);
  bool done = false;
  MT_CHECK(slot.dtype() == DType::I32 && pos.dtype() == DType::I32 && slot.numel() == N && pos.numel() == N &&
               slot.device() == Device::CUDA && pos.device() == Device::CUDA,
           "qkv_split_to_cache: slot and pos must be CUDA i32 [{}]", N);
  with_half(packed, [&]<typename T>(T*) {
    done = cuda::qkv_split_to_cache(h<T>(packed), h<T>(q), h<T>(k_cache), h<T>(v_cache), slot.data<int32_t>(),
                                    pos.data<int32_t>(), N, G, qpg, D, k_cache.dim(0), k_cache.dim(2), rope_args(rope),
                                    st());
  });
  if (done) return q;
  Tensor k, v;
  gpu::qkv_split(packed, q, k, v, N, 1, G, qpg, D, rope);
  gpu::kv_cache_write(k_cache, v_cache, k, v, slot, pos);
  return q;
}

Tensor qkv_merge(const Tensor& q, const Tensor& k, const Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
                 int64_t D, const RopeRef& rope) {
  Tensor packed = act({S * B, G * (qpg + 2) * D}, q);
  with_half(q, [&]<typename T>(T*) {
    cuda::qkv_merge(h<T>(q), h<T>(k), h<T>(v), h<T>(packed), S, B, G, qpg, D, rope_args(rope), st());
  });
  return packed;
}

Tensor heads_to_rows(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor r = act({S * B, H * D}, x);
  with_half(x, [&]<typename T>(T*) {
    cuda::heads_to_rows(h<T>(x), h<T>(r), S, B, H, D, st());
  });
  return r;
}

Tensor rows_to_heads(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor hd = act({B, H, S, D}, x);
  with_half(x, [&]<typename T>(T*) {
    cuda::rows_to_heads(h<T>(x), h<T>(hd), S, B, H, D, st());
  });
  return hd;
}

void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  with_half(x, [&]<typename T>(T*) {
    cuda::rope_forward(h<T>(x), f(cos), f(sin), x.dim(0), x.dim(1), x.dim(2), x.dim(3), rot_dim, st());
  });
}

void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  with_half(dx, [&]<typename T>(T*) {
    cuda::rope_backward(h<T>(dx), f(cos), f(sin), dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3), rot_dim, st());
  });
}

namespace {
// fp16 attention, the correctness path: the flash kernels are bf16-only, so fp16 tensors are
// widened to fp32 scratch (exact), run through the generic fp32 kernels (fp32 math, as every
// path), and the results rounded back to fp16 once, the same single rounding a fused fp16
// kernel would make. It costs extra memory traffic and the tensor cores; a fused fp16 path is
// future work.
Tensor widen(const Tensor& t) {
  Tensor r = stat(t.shape());
  cuda::cast(h<f16>(t), f(r), t.numel(), st());
  return r;
}
Tensor narrow_f16(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape(), DType::F16, Device::CUDA);
  cuda::cast(f(t), h<f16>(r), t.numel(), st());
  return r;
}
}  // namespace

void attention_forward(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse) {
  lse = stat({p.B, p.Hq, p.S});
  if (q.dtype() == DType::F16) {
    Tensor q32 = widen(q), k32 = widen(k), v32 = widen(v), o32 = stat(q.shape());
    cuda::attention_forward(p, f(q32), f(k32), f(v32), f(o32), f(lse), st());
    out = narrow_f16(o32);
    return;
  }
  out = act(q.shape(), q);
  cuda::attention_forward(p, h<bf16>(q), h<bf16>(k), h<bf16>(v), h<bf16>(out), f(lse), st());
}

void attention_backward(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  if (q.dtype() == DType::F16) {  // the fp16 correctness path (see widen above)
    Tensor q32 = widen(q), k32 = widen(k), v32 = widen(v), o32 = widen(out), do32 = widen(dout);
    Tensor dq32 = stat(q.shape()), dk32 = stat(k.shape()), dv32 = stat(v.shape());
    cuda::attention_backward(p, f(q32), f(k32), f(v32), f(o32), f(lse), f(do32), f(dq32), f(dk32), f(dv32), st());
    dq = narrow_f16(dq32);
    dk = narrow_f16(dk32);
    dv = narrow_f16(dv32);
    return;
  }
  dq = act(q.shape(), q);
  dk = act(k.shape(), q);
  dv = act(v.shape(), q);
  cuda::attention_backward(p, h<bf16>(q), h<bf16>(k), h<bf16>(v), h<bf16>(out), f(lse), h<bf16>(dout), h<bf16>(dq),
                           h<bf16>(dk), h<bf16>(dv), st());
}

Tensor swiglu_forward(const Tensor& x, Tensor* amax) {
  const int64_t rows = x.dim(0), F = x.dim(1) / 2;
  Tensor y = act({rows, F}, x);
  float* a = amax_out(amax, "swiglu_forward");
  with_half(x, [&]<typename T>(T*) {
    cuda::swiglu_forward(h<T>(x), h<T>(y), rows, F, st(), a);
  });
  return y;
}

Tensor swiglu_backward(const Tensor& dy, const Tensor& x, Tensor* amax) {
  Tensor dx = act(x.shape(), x);
  float* a = amax_out(amax, "swiglu_backward");
  with_half(x, [&]<typename T>(T*) {
    cuda::swiglu_backward(h<T>(dy), h<T>(x), h<T>(dx), x.dim(0), x.dim(1) / 2, st(), a);
  });
  return dx;
}

Tensor gelu_forward(const Tensor& x, bool tanh_approx) {
  Tensor y = act(x.shape(), x);
  with_half(x, [&]<typename T>(T*) {
    cuda::gelu_forward(h<T>(x), h<T>(y), x.numel(), tanh_approx, st());
  });
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x, bool tanh_approx) {
  Tensor dx = act(x.shape(), x);
  with_half(x, [&]<typename T>(T*) {
    cuda::gelu_backward(h<T>(dy), h<T>(x), h<T>(dx), x.numel(), tanh_approx, st());
  });
  return dx;
}

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  Tensor y = act(x.shape(), x);
  with_half(x, [&]<typename T>(T*) {
    cuda::dropout_forward(h<T>(x), h<T>(y), x.numel(), p, seed, offset, st());
  });
  return y;
}

Tensor dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset) {
  Tensor dx = act(dy.shape(), dy);
  with_half(dy, [&]<typename T>(T*) {
    cuda::dropout_backward(h<T>(dy), h<T>(dx), dy.numel(), p, seed, offset, st());
  });
  return dx;
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  losses = stat({N});
  lse = stat({N});
  with_half(logits, [&]<typename T>(T*) {
    cuda::cross_entropy_forward(h<T>(logits), targets.data<int32_t>(), f(losses), f(lse), N, V, V, st());
  });
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  // In place: the logits are not needed after their gradient is formed.
  with_half(logits, [&]<typename T>(T*) {
    cuda::cross_entropy_backward(h<T>(logits), targets.data<int32_t>(), f(lse), f(dloss), h<T>(logits), N, V, V,
                                 st());
  });
  return logits;
}

Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& dloss, Tensor& losses,
                           Tensor& lse) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  MT_CHECK(targets.numel() == N && dloss.numel() == N, "cross_entropy_fused: {} targets and {} dloss for {} rows",
           targets.numel(), dloss.numel(), N);
  losses = stat({N});
  lse = stat({N});
  with_half(logits, [&]<typename T>(T*) {  // in place, as cross_entropy_backward
    cuda::cross_entropy_fused(h<T>(logits), targets.data<int32_t>(), f(dloss), f(losses), f(lse), h<T>(logits), N, V, V,
                              st());
  });
  return logits;
}

void add_inplace(Tensor& y, const Tensor& x) {
  MT_CHECK(y.numel() == x.numel(), "add_inplace: {} vs {}", y.shape_str(), x.shape_str());
  if (y.dtype() == DType::F32 && x.dtype() == DType::F32) {  // fp32 parameters (e.g. a norm's 1 + w)
    cuda::add_inplace(f(y), f(x), y.numel(), st());
    return;
  }
  with_half(y, [&]<typename T>(T*) {
    cuda::add_inplace(h<T>(y), h<T>(x), y.numel(), st());
  });
}

void cast(const Tensor& src, Tensor& dst) {
  MT_CHECK(src.numel() == dst.numel(), "cast: {} vs {}", src.shape_str(), dst.shape_str());
  if (src.dtype() == DType::F32) {
    with_half(dst, [&]<typename T>(T*) {
      cuda::cast(f(src), h<T>(dst), src.numel(), st());
    });
  } else {
    with_half(src, [&]<typename T>(T*) {
      cuda::cast(h<T>(src), f(dst), src.numel(), st());
    });
  }
}

void copy_into(Tensor& dst, const Tensor& src) {
  MT_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype(), "copy_into: {} {} into {} {}",
           dtype_name(src.dtype()), src.shape_str(), dtype_name(dst.dtype()), dst.shape_str());
  if (dst.nbytes() > 0) MT_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, st()));
}

void round_bf16_inplace(Tensor&) {}  // GPU activations are bf16 already

void round_f16_inplace(Tensor&) { MT_CHECK(false, "fp16 activations are emulated on the CPU only"); }

}  // namespace mt::ops::gpu
