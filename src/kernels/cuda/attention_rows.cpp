// The direct path of the attention rows ops on the GPU (ops.def): cuDNN with O and dO in the
// rows layout (cuda::AttnLayout::Rows), on the compute stream. Each returns false, doing nothing,
// where the attention policy does not pick cuDNN for the call (not bf16, dropout, --attention-
// backend flash, unaligned or empty tensors, or a rows graph that does not build). Throws where
// that policy throws (--attention-backend fused with a shape cuDNN cannot run).
#include <initializer_list>

#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/context.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {
namespace {

using cuda::AttnLayout;
using cuda::bf16;

cudaStream_t stream() { return cuda::compute_stream(); }

// cuDNN runs bf16 storage only; fp16 keeps the fp32 correctness path of attention_forward.
bool all_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16 || t->device() != Device::CUDA) return false;
  return true;
}
// Calls that can never take the strided path (and need no policy error) skip its allocations.
bool never_cudnn(const AttentionShape& p) {
  return p.B * p.Hq * p.S == 0 || !p.plain() || cuda::attention_backend() == cuda::AttentionBackend::Flash;
}
Tensor bf16_tensor(const Shape& s) { return Tensor::empty(s, DType::BF16, Device::CUDA); }
const bf16* in(const Tensor& t) { return t.data<bf16>(); }
bf16* out(const Tensor& t) { return t.data<bf16>(); }

}  // namespace

bool attention_forward_rows_direct(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                   Tensor& out_rows, Tensor& lse) {
  if (never_cudnn(p) || !all_bf16({&q, &k, &v})) return false;
  // Allocated before the policy call, which checks every pointer's alignment; freed unused on
  // a fallback (stream-ordered pool, so that costs no sync).
  Tensor o = bf16_tensor({p.S * p.B, p.Hq * p.D});
  Tensor l = Tensor::empty({p.B, p.Hq, p.S}, DType::F32, Device::CUDA);
  const void* ptrs[] = {q.raw(), k.raw(), v.raw(), o.raw(), l.raw()};
  if (!cuda::attention_use_cudnn(p, false, ptrs, 5, AttnLayout::Rows)) return false;
  cuda::cudnn_attention_forward(p, in(q), in(k), in(v), out(o), l.data<float>(), stream(), AttnLayout::Rows);
  out_rows = std::move(o);
  lse = std::move(l);
  return true;
}

bool attention_backward_rows_direct(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq,
                                    Tensor& dk, Tensor& dv) {
  if (never_cudnn(p) || !all_bf16({&q, &k, &v, &out_rows, &dout_rows})) return false;
  MT_CHECK(lse.dtype() == DType::F32 && lse.device() == Device::CUDA && lse.numel() == p.B * p.Hq * p.S,
           "attention backward: lse must be a CUDA f32 [B, Hq, S] tensor, got {} {}", dtype_name(lse.dtype()),
           lse.shape_str());
  Tensor gq = bf16_tensor(q.shape()), gk = bf16_tensor(k.shape()), gv = bf16_tensor(v.shape());
  const void* ptrs[] = {q.raw(),         k.raw(),  v.raw(),  out_rows.raw(), lse.raw(),
                        dout_rows.raw(), gq.raw(), gk.raw(), gv.raw()};
  if (!cuda::attention_use_cudnn(p, true, ptrs, 9, AttnLayout::Rows)) return false;
  cuda::cudnn_attention_backward(p, in(q), in(k), in(v), in(out_rows), lse.data<float>(), in(dout_rows), out(gq),
                                 out(gk), out(gv), stream(), cuda::attention_deterministic(), AttnLayout::Rows);
  dq = std::move(gq);
  dk = std::move(gk);
  dv = std::move(gv);
  return true;
}

}  // namespace mt::ops::gpu
