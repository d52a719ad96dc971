#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

template <typename T>
void add_impl(T* y, const T* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T>
void scale_impl(T* y, T s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace

void add_inplace(float* y, const float* x, int64_t n) { add_impl(y, x, n); }
void add_inplace(double* y, const double* x, int64_t n) { add_impl(y, x, n); }
void scale_inplace(float* y, float s, int64_t n) { scale_impl(y, s, n); }
void scale_inplace(double* y, double s, int64_t n) { scale_impl(y, s, n); }

}  // namespace mt::cpu
