#include "core/philox.h"

#include <algorithm>
#include <cmath>

namespace mt {

namespace {
// Draws [first, first + n) serially: pair k of Box-Muller gives draws 2k (cos) and 2k+1 (sin).
void normal_serial(uint64_t seed, uint64_t offset, int64_t first, int64_t n, float* out, float mean, float stddev) {
  for (int64_t i = first; i < first + n;) {
    auto u = Philox::uniform4(seed, offset, static_cast<uint64_t>(i / 2));
    double u1 = std::max<double>(u[0] + u[1] / 16777216.0, 1e-12);
    double u2 = u[2] + u[3] / 16777216.0;
    double r = std::sqrt(-2.0 * std::log(u1));
    if (i % 2 == 0) out[i++ - first] = static_cast<float>(mean + stddev * r * std::cos(2 * M_PI * u2));
    if (i < first + n) out[i++ - first] = static_cast<float>(mean + stddev * r * std::sin(2 * M_PI * u2));
  }
}
}  // namespace

void RngState::normal_slice(uint64_t off, int64_t first, int64_t n, float* out, float mean, float stddev) const {
  // Chunks of an even length keep every Box-Muller pair inside one chunk; a billion-element
  // weight then initialises on all cores instead of one.
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk;
    normal_serial(seed, off, first + b, std::min(kChunk, n - b), out + b, mean, stddev);
  }
}

void RngState::normal(float* out, int64_t n, float mean, float stddev) {
  normal_slice(next_offset(), 0, n, out, mean, stddev);
}

}  // namespace mt
