// Gradient norm and clipping as megatron/core/optimizer/clip_grads.py; the sum of squares is the
// reproducible one of kernels/cpu (the same bits whatever the thread count).
#include "kernels/cpu/ops.h"
#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

double grad_norm_squared(const float* grads, int64_t n) { return cpu::sum_squares(grads, n); }

void clip_grads(float* grads, int64_t n, double total_norm, double max_norm) {
  const double clip_coeff = max_norm / (total_norm + 1.0e-6);
  // Written as Megatron's "if clip_coeff < 1.0" so a NaN norm leaves the grads alone (the
  // caller detects NaN and skips the step).
  if (!(clip_coeff < 1.0)) return;
  const float c = static_cast<float>(clip_coeff);
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) grads[i] *= c;
}

}  // namespace mt::optim
