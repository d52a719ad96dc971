// Gradient norm and clipping as megatron/core/optimizer/clip_grads.py, made reproducible:
// the sum of squares is cut into fixed chunks, each summed by one thread in a fixed order
// and the chunk sums added in index order, so the bits do not depend on the thread count.
#include <algorithm>
#include <vector>

#include "optim/optimizer.h"
#include "optim/segments.h"

namespace mt::optim {

namespace {
constexpr int64_t kChunk = 1 << 16;
constexpr int kLanes = 8;  // independent accumulators so the inner loop can vectorise

double chunk_sum_squares(const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      acc[l] += v * v;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const double v = x[i];
    acc[l] += v * v;
  }
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}
}  // namespace

double grad_norm_squared(const float* grads, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    partial[static_cast<size_t>(c)] = chunk_sum_squares(grads + begin, std::min(kChunk, n - begin));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

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
