#pragma once
// CPU reference ops. Every op has its forward and backward side by side.
// Conventions:
//  * Pointers are contiguous row-major unless stated. `rows` = flattened leading dims.
//  * Every op exists for float (the training path) and double (the same code instantiated in
//    fp64, so gradient checks against finite differences test the real implementation).
//  * Backward functions WRITE input gradients (dx) and ACCUMULATE (+=) parameter gradients
//    (dw, db), because parameter grads live in the model's fp32 main-grad buffer and are
//    accumulated over micro-batches.
//  * Linear weights use Megatron's layout [out_features, in_features].
//  * Multi-threading is by OpenMP / OpenBLAS; results must not depend on the thread count
//    (each output element is reduced in a fixed order).
//  * Dropout (hidden and attention) keeps element i when Philox::uniform(seed, offset, i) >= p
//    and scales kept elements by 1/(1-p); p >= 1 drops everything.
#include <cstdint>

#include "kernels/attention_shape.h"

namespace mt::cpu {

// ---- GEMM (OpenBLAS sgemm/dgemm). y[M,N] = x[M,K] @ w[N,K]^T (+ b[N]).
void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K);
void linear_forward(const double* x, const double* w, const double* b, double* y, int64_t M, int64_t N, int64_t K);
// dx[M,K] = dy @ w (written, if dx != nullptr); dw[N,K] += dy^T @ x (if dw); db[N] += sum_rows dy (if db).
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K);
void linear_backward(const double* dy, const double* x, const double* w, double* dx, double* dw, double* db,
                     int64_t M, int64_t N, int64_t K);

// ---- Embedding. out[n, dim] = table[ids[n], :]; dtable[ids[n], :] += dout[n, :].
// Repeated ids are summed in increasing n, whatever the thread count.
void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim);
void embedding_forward(const int32_t* ids, const double* table, double* out, int64_t n, int64_t dim);
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim);
void embedding_backward(const int32_t* ids, const double* dout, double* dtable, int64_t n, int64_t dim);

// ---- RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). rstd[rows] saved for backward.
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps);
void rmsnorm_forward(const double* x, const double* w, double* y, double* rstd, int64_t rows, int64_t dim,
                     double eps);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      int64_t rows, int64_t dim);
void rmsnorm_backward(const double* dy, const double* x, const double* w, const double* rstd, double* dx, double* dw,
                      int64_t rows, int64_t dim);

// ---- LayerNorm: y = (x - mean) * rstd * w + b.
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t dim, float eps);
void layernorm_forward(const double* x, const double* w, const double* b, double* y, double* mean, double* rstd,
                       int64_t rows, int64_t dim, double eps);
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim);
void layernorm_backward(const double* dy, const double* x, const double* w, const double* mean, const double* rstd,
                        double* dx, double* dw, double* db, int64_t rows, int64_t dim);

// ---- RoPE, rotate-half (GPT-NeoX / Megatron / HF Llama style), applied to the first
// `rot_dim` channels of each head (rot_dim = head_dim * rotary_percent, even); the rest pass.
// cos/sin tables: [seq, rot_dim/2], built by rope_tables with inv_freq[i] = base^(-2i/rot_dim).
void rope_tables(int64_t seq, int64_t rot_dim, double base, float* cos_out, float* sin_out);
void rope_tables(int64_t seq, int64_t rot_dim, double base, double* cos_out, double* sin_out);
// x: [B, H, S, D] in place. Element (b,h,s,:) takes table row s, or b*S + s with per_sample
// (tables of B*S rows: positions that differ between samples, as packed documents have; the
// Tensor-level ops take those as [B, S, rot/2]).
void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                  int64_t rot_dim, bool per_sample = false);
void rope_forward(double* x, const double* cos, const double* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                  int64_t rot_dim, bool per_sample = false);
// Backward is the inverse rotation of dy, in place.
void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                   int64_t rot_dim, bool per_sample = false);
void rope_backward(double* dx, const double* cos, const double* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                   int64_t rot_dim, bool per_sample = false);

// ---- Causal self-attention with GQA (Hq = Hkv * group), tiled with an online softmax:
// no S x S matrix is kept; lse[B, Hq, S] (log-sum-exp of scaled scores) is saved for backward.
// q, k, v, out as ops::AttentionShape describes (out like q); dropout as there.
void attention_forward(const ops::AttentionShape& p, const float* q, const float* k, const float* v, float* out,
                       float* lse);
void attention_forward(const ops::AttentionShape& p, const double* q, const double* k, const double* v, double* out,
                       double* lse);
// Writes dq, dk, dv (not accumulated).
void attention_backward(const ops::AttentionShape& p, const float* q, const float* k, const float* v, const float* out,
                        const float* lse, const float* dout, float* dq, float* dk, float* dv);
void attention_backward(const ops::AttentionShape& p, const double* q, const double* k, const double* v,
                        const double* out, const double* lse, const double* dout, double* dq, double* dk, double* dv);

// ---- SwiGLU on Megatron's fc1 output: x[rows, 2F] = [gate | up]; y[rows, F] = silu(gate) * up.
void swiglu_forward(const float* x, float* y, int64_t rows, int64_t F);
void swiglu_forward(const double* x, double* y, int64_t rows, int64_t F);
void swiglu_backward(const float* dy, const float* x, float* dx, int64_t rows, int64_t F);
void swiglu_backward(const double* dy, const double* x, double* dx, int64_t rows, int64_t F);

// ---- GELU: exact erf form (Megatron default) or tanh approximation (--openai-gelu, HF gelu_new).
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_forward(const double* x, double* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx);
void gelu_backward(const double* dy, const double* x, double* dx, int64_t n, bool tanh_approx);

// ---- Dropout with inverted scaling; mask regenerated from Philox (seed, offset, i).
void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t offset);
void dropout_forward(const double* x, double* y, int64_t n, float p, uint64_t seed, uint64_t offset);
void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t offset);
void dropout_backward(const double* dy, double* dx, int64_t n, float p, uint64_t seed, uint64_t offset);

// ---- Softmax cross-entropy over logits[N, V] (V may include padded entries: only the first
// `valid_v` columns take part). losses[N] = lse - logit[target]; lse[N] saved.
// Targets must lie in [0, valid_v).
void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, float* lse, int64_t N,
                           int64_t V, int64_t valid_v);
void cross_entropy_forward(const double* logits, const int32_t* targets, double* losses, double* lse, int64_t N,
                           int64_t V, int64_t valid_v);
// dlogits[N, V] = dloss[n] * (softmax - onehot); padded columns get 0.
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                            float* dlogits, int64_t N, int64_t V, int64_t valid_v);
void cross_entropy_backward(const double* logits, const int32_t* targets, const double* lse, const double* dloss,
                            double* dlogits, int64_t N, int64_t V, int64_t valid_v);

// ---- Elementwise helpers used by the model.
void add_inplace(float* y, const float* x, int64_t n);  // y += x
void add_inplace(double* y, const double* x, int64_t n);
void scale_inplace(float* y, float s, int64_t n);
void scale_inplace(double* y, double s, int64_t n);

// ---- Optimizer helpers. Sum of squares of x[n] in fp64 over fixed chunks added in order: the
// same bits whatever the thread count (the gradient norm).
double sum_squares(const float* x, int64_t n);

}  // namespace mt::cpu
