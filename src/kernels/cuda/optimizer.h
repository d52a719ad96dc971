#pragma once
// The GPU optimizer step on flat fp32 device buffers, for the trainer's --device cuda path: loss
// unscaling with the inf/nan check, clipping, and AdamW writing the half compute copy. (The
// gradient norm is an op: ops::grad_norm_squared.)
#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mt::ops::gpu {

// Loss scaling (--fp16): grads *= inv_scale over the [begin, end) ranges of the fp32 grad
// buffer, returning whether any result is inf or nan (optim::unscale_and_check's semantics).
// One device flag, read once: synchronises the stream.
bool unscale_and_check(float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges, float inv_scale);
void clip_grads(float* grads, int64_t n, double total_norm, double max_norm);
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
