#include "core/philox.h"

#include <cmath>

namespace mt {

void RngState::normal(float* out, int64_t n, float mean, float stddev) {
  uint64_t off = next_offset();
  for (int64_t i = 0; i < n; i += 2) {
    auto u = Philox::uniform4(seed, off, static_cast<uint64_t>(i / 2));
    double u1 = std::max<double>(u[0] + u[1] / 16777216.0, 1e-12);
    double u2 = u[2] + u[3] / 16777216.0;
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(mean + stddev * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + stddev * r * std::sin(2 * M_PI * u2));
  }
}

}  // namespace mt
