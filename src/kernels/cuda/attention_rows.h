#pragma once
// The CUDA side of kernels/attention_rows.h: cuDNN's fused attention with O and dO in the rows
// layout (cuda::AttnLayout::Rows), on the compute stream. Each returns false, doing nothing,
// where the attention policy does not pick cuDNN for the call (not bf16, dropout, --attention-
// backend flash, unaligned or empty tensors, or a rows graph that does not build); the caller
// then runs the heads layout and copies. Throws where that policy throws (--attention-backend
// fused with a shape cuDNN cannot run).
#include "core/tensor.h"
#include "kernels/cpu/ops.h"

namespace mt::ops::gpu {

bool attention_forward_rows_direct(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                   Tensor& out_rows, Tensor& lse);
bool attention_backward_rows_direct(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq,
                                    Tensor& dk, Tensor& dv);

}  // namespace mt::ops::gpu
