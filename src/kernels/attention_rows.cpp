#include "kernels/attention_rows.h"

#include "core/error.h"
#include "kernels/ops.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/attention_rows.h"
#endif

namespace mt::ops {
namespace {

void check_rows(const ops::AttentionShape& p, const Tensor& t, const char* what) {
  MT_CHECK(t.numel() == p.S * p.B * p.Hq * p.D, "attention rows: {} {} is not [S*B, Hq*D] = [{}, {}]", what,
           t.shape_str(), p.S * p.B, p.Hq * p.D);
}

// cuDNN with strided O: true when it ran (CUDA tensors, and the policy chose cuDNN for rows).
bool direct_forward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out_rows,
                    Tensor& lse) {
#ifdef MT_HAVE_CUDA
  if (q.device() == Device::CUDA) return gpu::attention_forward_rows_direct(p, q, k, v, out_rows, lse);
#endif
  return false;
}

bool direct_backward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                     Tensor& dv) {
#ifdef MT_HAVE_CUDA
  if (q.device() == Device::CUDA)
    return gpu::attention_backward_rows_direct(p, q, k, v, out_rows, lse, dout_rows, dq, dk, dv);
#endif
  return false;
}

}  // namespace

void attention_forward_rows(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            Tensor& out_rows, Tensor& lse) {
  if (direct_forward(p, q, k, v, out_rows, lse)) return;
  Tensor out;
  attention_forward(p, q, k, v, out, lse);
  out_rows = heads_to_rows(out, p.S, p.B, p.Hq, p.D);
}

void attention_backward_rows(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                             Tensor& dv) {
  check_rows(p, out_rows, "out");
  check_rows(p, dout_rows, "dout");
  if (direct_backward(p, q, k, v, out_rows, lse, dout_rows, dq, dk, dv)) return;
  const Tensor out = rows_to_heads(out_rows, p.S, p.B, p.Hq, p.D);
  const Tensor dout = rows_to_heads(dout_rows, p.S, p.B, p.Hq, p.D);
  attention_backward(p, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace mt::ops
