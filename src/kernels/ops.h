#pragma once
// Tensor-level ops used by the model. Each call dispatches on the device of its inputs: CPU
// tensors go to the fp32 reference kernels in kernels/cpu; CUDA tensors (bf16 activations,
// fp32 main grads) go to kernels/cuda once the CUDA backend is wired in. Outputs are allocated
// here with the input's device and dtype. Activations are [rows, features] with rows = S*B in
// Megatron's [s, b] order; per-head tensors are [B, H, S, D].
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/ops.h"

namespace mt::ops {

// y = x w^T (+ b). w: [out, in].
Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor* b);
// y = x w^T (+ b) + residual (residual: [rows, out] elements, x's dtype, only read). The GPU adds
// the residual in the GEMM's epilogue (one kernel, one rounding of the fp32 sum to the half
// type); the CPU runs the fp32 linear, then the add: the same bits as linear_forward + add_inplace.
Tensor linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& residual);
// Returns dx (undefined when !need_dx); accumulates dw (+ db) into fp32 main-grad views, or with
// !accumulate_dw writes dw (the GEMM's beta = 0: a step's first gradient of a weight, with no
// zeroing pass over it before; db still accumulates).
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db, bool need_dx = true,
                       bool accumulate_dw = true);
// Pieces of the above, for overlapping communication with the GEMMs (--tp-comm-overlap):
// y = x w^T + b into a preallocated [rows, out] tensor (or a row slice of one); dx = dy w
// alone; dw += dy^T x (and db += column sums of dy) alone. Same GEMMs, same results.
void linear_forward_into(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
Tensor linear_backward_data(const Tensor& dy, const Tensor& w);
void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor* db, bool accumulate_dw = true);

Tensor embedding_forward(const Tensor& ids, const Tensor& table);  // ids: I32 [n]
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
// x[s*B + b, :] += pe[s, :] and its backward (dpe[s] += sum_b dx[s*B+b]).
void add_position_embedding(Tensor& x, const Tensor& pe, int64_t S, int64_t B);
void position_embedding_backward(const Tensor& dx, Tensor& dpe, int64_t S, int64_t B);

// Norm backwards return dx (+ dx_add when given: the residual branch's gradient, added in the
// same pass on the GPU) and accumulate dw (db) into fp32 main grads.
Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd);
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dw,
                        const Tensor* dx_add = nullptr);
Tensor layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& mean, Tensor& rstd);
Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dw, Tensor& db, const Tensor* dx_add = nullptr);
// The residual add fused into the norm after it: sum = x + residual (stored in x's type, and
// that rounded value is what gets normalised), returns norm(sum). One pass on the GPU.
Tensor add_rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& rstd,
                           Tensor& sum);
Tensor add_layernorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, float eps,
                             Tensor& mean, Tensor& rstd, Tensor& sum);

// Rotary embedding applied inside the QKV split (q and k) and merge (their gradients rotated
// back), which the GPU fuses into the copy: rotate-half over rot_dim, tables [S, rot_dim/2].
struct RopeRef {
  const Tensor* cos = nullptr;
  const Tensor* sin = nullptr;
  int64_t rot_dim = 0;
};
// Packed Megatron QKV rows [S*B, G*(qpg+2)*D] <-> q [B, G*qpg, S, D], k/v [B, G, S, D].
void qkv_split(const Tensor& packed, Tensor& q, Tensor& k, Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, const RopeRef& rope = {});
// q and k (gradients) may be overwritten when rope is given.
Tensor qkv_merge(const Tensor& q, const Tensor& k, const Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
                 int64_t D, const RopeRef& rope = {});
// [B, H, S, D] <-> [S*B, H*D].
Tensor heads_to_rows(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D);
Tensor rows_to_heads(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D);

void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim);  // x: [B, H, S, D]
void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, int64_t rot_dim);

void attention_forward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse);
void attention_backward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

Tensor swiglu_forward(const Tensor& h);  // [rows, 2F] -> [rows, F]
Tensor swiglu_backward(const Tensor& dy, const Tensor& h);
Tensor gelu_forward(const Tensor& h, bool tanh_approx);
Tensor gelu_backward(const Tensor& dy, const Tensor& h, bool tanh_approx);

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset);
Tensor dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset);

// logits [N, V]; targets I32 [N]; writes losses [N] and lse [N] (fp32).
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss);
// Both in one op, for training heads that know dloss [N] at forward time: writes losses and lse
// as cross_entropy_forward and returns cross_entropy_backward's gradient. On the GPU the
// gradient is written over the logits (as the backward does) by one kernel that reads each row
// once (cuda::cross_entropy_fused); the CPU runs the forward and backward references.
Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& dloss, Tensor& losses,
                           Tensor& lse);

void add_inplace(Tensor& y, const Tensor& x);
void cast(const Tensor& src, Tensor& dst);  // dtype conversion into dst (same numel and device)
void round_bf16_inplace(Tensor& x);  // CPU emulation of bf16 activation storage
void round_f16_inplace(Tensor& x);   // CPU emulation of fp16 activation storage (overflow -> inf)
// Rounds an f32 through IEEE fp16 and back: nearest-even, subnormals, overflow to inf.
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

}  // namespace mt::ops
