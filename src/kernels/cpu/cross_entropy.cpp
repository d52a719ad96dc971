// Softmax cross-entropy over (possibly vocab-padded) logits. Only the first valid_v columns
// enter the softmax; padded columns get zero gradient. lse is saved so backward needs one
// pass and no second reduction. Rows are independent: threads split rows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {

template <typename T>
void cross_entropy_forward_impl(const T* logits, const int32_t* targets, T* losses, T* lse, int64_t N, int64_t V,
                                int64_t valid_v) {
  MT_CHECK(valid_v > 0 && valid_v <= V, "cross entropy: valid vocab {} outside (0, {}]", valid_v, V);
  // A large vocabulary makes this exp-bound: the vectorised exp of vec_math.h, into a per-thread
  // scratch row, then a fixed-order double sum (thread-count independent).
#pragma omp parallel if (N * valid_v > 65536)
  {
    std::vector<T> scratch(static_cast<size_t>(valid_v));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const T* row = logits + r * V;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < valid_v; ++j) mx = std::max(mx, row[j]);
      std::copy(row, row + valid_v, scratch.data());
      vec::exp_shifted(scratch.data(), valid_v, mx);
      const double sum = vec::sum_lanes(scratch.data(), valid_v);
      const T l = mx + static_cast<T>(std::log(sum));
      lse[r] = l;
      losses[r] = l - row[targets[r]];
    }
  }
}

template <typename T>
void cross_entropy_backward_impl(const T* logits, const int32_t* targets, const T* lse, const T* dloss, T* dlogits,
                                 int64_t N, int64_t V, int64_t valid_v) {
#pragma omp parallel for schedule(static) if (N * V > 65536)
  for (int64_t r = 0; r < N; ++r) {
    const T* row = logits + r * V;
    T* drow = dlogits + r * V;
    const T g = dloss[r], l = lse[r];
    std::copy(row, row + valid_v, drow);
    vec::exp_shifted(drow, valid_v, l);
    for (int64_t j = 0; j < valid_v; ++j) drow[j] *= g;
    std::fill(drow + valid_v, drow + V, T(0));
    drow[targets[r]] -= g;
  }
}

}  // namespace

void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, float* lse, int64_t N,
                           int64_t V, int64_t valid_v) {
  cross_entropy_forward_impl(logits, targets, losses, lse, N, V, valid_v);
}
void cross_entropy_forward(const double* logits, const int32_t* targets, double* losses, double* lse, int64_t N,
                           int64_t V, int64_t valid_v) {
  cross_entropy_forward_impl(logits, targets, losses, lse, N, V, valid_v);
}
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                            float* dlogits, int64_t N, int64_t V, int64_t valid_v) {
  cross_entropy_backward_impl(logits, targets, lse, dloss, dlogits, N, V, valid_v);
}
void cross_entropy_backward(const double* logits, const int32_t* targets, const double* lse, const double* dloss,
                            double* dlogits, int64_t N, int64_t V, int64_t valid_v) {
  cross_entropy_backward_impl(logits, targets, lse, dloss, dlogits, N, V, valid_v);
}

}  // namespace mt::cpu
