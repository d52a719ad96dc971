#pragma once
// The CUDA side of kernels/ops.h: the same Tensor-level ops for Device::CUDA tensors (bf16 or
// fp16 activations and parameter copies, by the tensors' dtype; fp32 main grads and statistics),
// on the device's compute stream. ops.cpp forwards here when its inputs live on the GPU.
#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "optim/optimizer.h"

#include <string>
#include <vector>

namespace mt::ops::gpu {

// Device setup: picks the device (CUDA_VISIBLE_DEVICES applies), creates the compute stream,
// the cuBLASLt handle and the stream-ordered allocator, and registers them with core.
// Returns false when no GPU is present.
bool available();
void init(int device = 0);
void synchronize();
int device_count();
// The compute stream (a cudaStream_t) that every op runs on: communication waits for it.
void* compute_stream();
int current_device();
size_t peak_memory_bytes();
void reset_peak_memory();
std::string device_name();

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor* b);
Tensor linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& residual);
Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db, bool need_dx,
                       bool accumulate_dw);
void linear_forward_into(const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y);
Tensor linear_backward_data(const Tensor& dy, const Tensor& w);
void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor* db, bool accumulate_dw);
Tensor embedding_forward(const Tensor& ids, const Tensor& table);
void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable);
void add_position_embedding(Tensor& x, const Tensor& pe, int64_t S, int64_t B);
void position_embedding_backward(const Tensor& dx, Tensor& dpe, int64_t S, int64_t B);
Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd);
Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dw,
                        const Tensor* dx_add);
Tensor layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& mean, Tensor& rstd);
Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dw, Tensor& db, const Tensor* dx_add);
Tensor add_rmsnorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, float eps, Tensor& rstd,
                           Tensor& sum);
Tensor add_layernorm_forward(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b, float eps,
                             Tensor& mean, Tensor& rstd, Tensor& sum);
void qkv_split(const Tensor& packed, Tensor& q, Tensor& k, Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, const RopeRef& rope);
Tensor qkv_merge(const Tensor& q, const Tensor& k, const Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
                 int64_t D, const RopeRef& rope);
Tensor heads_to_rows(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D);
Tensor rows_to_heads(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D);
void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim);
void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, int64_t rot_dim);
void attention_forward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse);
void attention_backward(const ops::AttentionShape& p, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
Tensor swiglu_forward(const Tensor& h);
Tensor swiglu_backward(const Tensor& dy, const Tensor& h);
Tensor gelu_forward(const Tensor& h, bool tanh_approx);
Tensor gelu_backward(const Tensor& dy, const Tensor& h, bool tanh_approx);
Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset);
Tensor dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset);
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse);
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss);
// Forward and backward in one kernel; the gradient is written over the logits and returned.
Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& dloss, Tensor& losses,
                           Tensor& lse);
void add_inplace(Tensor& y, const Tensor& x);
void cast(const Tensor& src, Tensor& dst);  // f32 <-> bf16 or fp16, same numel, both on the GPU

// Optimizer-side helpers on flat fp32 device buffers.
double grad_norm_squared(const float* grads, int64_t n);
// Sum of squares over the [begin, end) ranges of `grads` (one pass, one host sync).
double grad_norm_squared(const float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges);
void clip_grads(float* grads, int64_t n, double total_norm, double max_norm);
// Loss scaling (--fp16): grads *= inv_scale over the [begin, end) ranges of the fp32 grad
// buffer, returning whether any result is inf or nan (optim::unscale_and_check's semantics).
// One device flag, read once: synchronises the stream.
bool unscale_and_check(float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges, float inv_scale);
struct AdamWState;
// AdamW over the spans of a flat buffer, writing the compute copy (`half`: bf16 or fp16) in the
// same pass.
class AdamW {
 public:
  AdamW(int64_t numel, std::vector<optim::ParamSpan> spans, double beta1, double beta2, double eps,
        DType half = DType::BF16);
  ~AdamW();
  void step(float* params, const float* grads, uint16_t* params_half, double lr, double wd);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t s) { step_ = s; }
  float* exp_avg() const;
  float* exp_avg_sq() const;

 private:
  AdamWState* st_;
  int64_t step_ = 0;
};

}  // namespace mt::ops::gpu
