#include "kernels/cpu/ops.h"

namespace mt::cpu {

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

}  // namespace mt::cpu
