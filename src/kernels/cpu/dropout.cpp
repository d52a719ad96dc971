// Dropout with inverted scaling. The mask is never stored: element i is kept when
// Philox::uniform(seed, offset, i) >= p, so backward (and a GPU kernel) regenerates exactly
// the same mask from (seed, offset). One Philox block gives the draws of 4 consecutive
// elements, so the loops walk 4-aligned groups.
#include <algorithm>

#include "core/philox.h"
#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

constexpr int64_t kChunk = 4096;  // multiple of 4: each chunk starts on a Philox block

template <typename T>
void dropout_apply(const T* x, T* y, int64_t n, float p, uint64_t seed, uint64_t offset) {
  if (p <= 0.f) {
    std::copy(x, x + n, y);
    return;
  }
  if (p >= 1.f) {
    std::fill(y, y + n, T(0));
    return;
  }
  const T scale = T(1) / (T(1) - static_cast<T>(p));
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > 4 * kChunk)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i0 = c * kChunk; i0 < end; i0 += 4) {
      const auto u = Philox::uniform4(seed, offset, static_cast<uint64_t>(i0 / 4));
      for (int64_t l = 0; l < 4 && i0 + l < end; ++l) y[i0 + l] = u[l] >= p ? x[i0 + l] * scale : T(0);
    }
  }
}

}  // namespace

// The mask and scale are the same linear map in both directions, so backward is forward on dy.
void dropout_forward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_apply(x, y, n, p, seed, offset);
}
void dropout_forward(const double* x, double* y, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_apply(x, y, n, p, seed, offset);
}
void dropout_backward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_apply(dy, dx, n, p, seed, offset);
}
void dropout_backward(const double* dy, double* dx, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_apply(dy, dx, n, p, seed, offset);
}

}  // namespace mt::cpu
