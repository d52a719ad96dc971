// Sum of squares as megatron/core/optimizer/clip_grads.py's gradient norm needs it, made
// reproducible: the buffer is cut into fixed chunks, each summed by one thread in a fixed order
// and the chunk sums added in index order, so the bits do not depend on the thread count.
#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/threads.h"
#include "kernels/op_backends.h"

namespace mt::cpu {
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

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    partial[static_cast<size_t>(c)] = chunk_sum_squares(x + begin, std::min(kChunk, n - begin));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace mt::cpu

namespace mt::ops::host {

double grad_norm_squared(const Tensor& grads, const FlatRanges& ranges) {
  check_vector(grads, Device::CPU, DType::F32, grads.numel(), "grad_norm_squared");
  const float* g = grads.data<float>();
  double sq = 0;
  for (auto [a, b] : ranges) sq += cpu::sum_squares(g + a, b - a);
  return sq;
}

}  // namespace mt::ops::host
