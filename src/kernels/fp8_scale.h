#pragma once
// FP8 scale rules shared by the CPU reference and the CUDA kernels (host and device code), so
// both devices compute every scale with the same fp32 expressions.
#include <cfloat>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define MT_FP8_HD __host__ __device__
#else
#define MT_FP8_HD
#endif

namespace mt::fp8 {

// Transformer Engine's scale from an amax: scaled_max / amax (scaled_max = fp8_max * 2^-margin),
// `fallback` when amax is 0 or not finite (delayed scaling keeps its old scale, current scaling
// takes 1), FLT_MAX when the quotient overflows (an amax too small for fp32).
// (Bit tests rather than std::isfinite, so that host and device compile the same code.)
MT_FP8_HD inline bool is_finite(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return (u & 0x7f800000u) != 0x7f800000u;
}
MT_FP8_HD inline float scale_from_amax(float amax, float scaled_max, float fallback) {
  float s = (is_finite(amax) && amax > 0.f) ? scaled_max / amax : fallback;
  if (!is_finite(s)) s = FLT_MAX;
  return s;
}

// The largest power of two <= s (s positive and finite): blockwise scaling's scales, which make
// the dequantisation exact in any precision.
MT_FP8_HD inline float pow2_floor(float s) {
  uint32_t u;
  memcpy(&u, &s, 4);
  u &= 0xff800000u;
  float r;
  memcpy(&r, &u, 4);
  return r;
}

// A blockwise tile's scale from its amax: the largest power of two <= fp8_max / amax (1 for an
// all-zero tile), so that amax * scale never exceeds fp8_max and 1 / scale is exact.
MT_FP8_HD inline float block_scale(float amax, float fp8_max) { return pow2_floor(scale_from_amax(amax, fp8_max, 1.f)); }

// fp8_max * 2^-margin, exactly (a power-of-two factor; margin in [0, 64]).
MT_FP8_HD inline float scaled_max(float fp8_max, int margin) {
  float m = fp8_max;
  for (int i = 0; i < margin; ++i) m *= 0.5f;
  return m;
}

}  // namespace mt::fp8
