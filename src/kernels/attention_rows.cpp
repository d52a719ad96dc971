// The attention rows ops (ops.h): the device's direct path where it serves the call, else the
// heads layout and a copy. Device-neutral: every call below goes through the ops' dispatch.
#include "core/error.h"
#include "kernels/ops.h"

namespace mt::ops {
namespace {

void check_rows(const AttentionShape& p, const Tensor& t, const char* what) {
  MT_CHECK(t.numel() == p.S * p.B * p.Hq * p.D, "attention rows: {} {} is not [S*B, Hq*D] = [{}, {}]", what,
           t.shape_str(), p.S * p.B, p.Hq * p.D);
}

}  // namespace

void attention_forward_rows(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            Tensor& out_rows, Tensor& lse) {
  if (attention_forward_rows_direct(p, q, k, v, out_rows, lse)) return;
  Tensor out;
  attention_forward(p, q, k, v, out, lse);
  out_rows = heads_to_rows(out, p.S, p.B, p.Hq, p.D);
}

void attention_backward_rows(const AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                             Tensor& dv) {
  check_rows(p, out_rows, "out");
  check_rows(p, dout_rows, "dout");
  if (attention_backward_rows_direct(p, q, k, v, out_rows, lse, dout_rows, dq, dk, dv)) return;
  const Tensor out = rows_to_heads(out_rows, p.S, p.B, p.Hq, p.D);
  const Tensor dout = rows_to_heads(dout_rows, p.S, p.B, p.Hq, p.D);
  attention_backward(p, q, k, v, out, lse, dout, dq, dk, dv);
}

}  // namespace mt::ops
