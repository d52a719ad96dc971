#pragma once
// The attention core with its output in the rows layout that linear_proj consumes: out_rows
// [S*B, Hq*D], rows in Megatron's (s, b) order, instead of heads [B, Hq, S, D]. The results are
// exactly those of attention_forward + heads_to_rows (and rows_to_heads + attention_backward).
//
// Why: when cuDNN runs the core (CUDA, bf16, no dropout, its graph builds; the policy of
// kernels/cuda/attention_cudnn.h), it reads and writes O and dO through strides, which saves a
// read and a write of the output per direction and keeps one copy of it instead of two.
// Elsewhere (CPU, fp16, dropout, --attention-backend flash, a rows graph that does not build)
// these are that composition, copies included; the backward then also copies O back to heads.
#include "core/tensor.h"
#include "kernels/cpu/ops.h"

namespace mt::ops {

// q [B,Hq,S,D], k/v [B,Hkv,S,D]; writes out_rows [S*B, Hq*D] (q's dtype) and lse fp32 [B,Hq,S].
void attention_forward_rows(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            Tensor& out_rows, Tensor& lse);
// out_rows and dout_rows [S*B, Hq*D]; writes dq, dk, dv in the heads layout of q, k, v.
void attention_backward_rows(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out_rows, const Tensor& lse, const Tensor& dout_rows, Tensor& dq, Tensor& dk,
                             Tensor& dv);

}  // namespace mt::ops
