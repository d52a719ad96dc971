#include "core/fp8.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace mt {

namespace {

struct Fp8Spec {
  int man_bits;  // stored mantissa bits
  int bias;      // exponent bias; the smallest normal exponent is 1 - bias
  float max;     // largest finite magnitude
};

constexpr Fp8Spec spec(Fp8Format f) { return f == Fp8Format::E4M3 ? Fp8Spec{3, 7, 448.f} : Fp8Spec{2, 15, 57344.f}; }

// 2^k for the small |k| used here, built from its bits (exact, no libm).
float pow2(int k) {
  const uint32_t u = static_cast<uint32_t>(k + 127) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The binary exponent of a finite, non-zero float (that of 2^-126 for fp32 subnormals, which all
// lie far below FP8's smallest subnormal and round to zero anyway).
int exponent_of(float a) {
  uint32_t u;
  std::memcpy(&u, &a, 4);
  const int e = static_cast<int>((u >> 23) & 0xff);
  return (e == 0 ? 1 : e) - 127;
}

}  // namespace

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

float fp8_max(Fp8Format f) { return spec(f).max; }

float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8Spec s = spec(f);
  const bool neg = (code & 0x80) != 0;
  const int exp_field = (code & 0x7f) >> s.man_bits;
  const int man = code & ((1 << s.man_bits) - 1);
  const int exp_max = (1 << (7 - s.man_bits)) - 1;
  float v;
  if (f == Fp8Format::E4M3 && exp_field == exp_max && man == (1 << s.man_bits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (f == Fp8Format::E5M2 && exp_field == exp_max) {
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (exp_field == 0) {
    v = static_cast<float>(man) * pow2(1 - s.bias - s.man_bits);  // subnormal
  } else {
    v = static_cast<float>((1 << s.man_bits) + man) * pow2(exp_field - s.bias - s.man_bits);
  }
  return neg ? -v : v;
}

float fp8_round(float x, Fp8Format f) {
  if (std::isnan(x)) return x;
  const Fp8Spec s = spec(f);
  const float a = std::fabs(x);
  if (a >= s.max) return std::copysign(s.max, x);  // saturation, infinities included
  if (a == 0.f) return x;
  // The grid spacing at a's binade (the subnormal spacing below the smallest normal): a / q and
  // r * q are exact (powers of two), and nearbyint rounds half to even in the default mode.
  const int e = exponent_of(a) < 1 - s.bias ? 1 - s.bias : exponent_of(a);
  const float q = pow2(e - s.man_bits);
  const float r = std::nearbyint(a / q) * q;  // <= max: max is on the grid and a < max
  return std::copysign(r, x);
}

uint8_t fp8_encode(float x, Fp8Format f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | 0x7f;
  const Fp8Spec s = spec(f);
  const float a = std::fabs(fp8_round(x, f));
  if (a == 0.f) return sign;
  const int e = exponent_of(a);
  if (e < 1 - s.bias)  // subnormal: a multiple of the smallest subnormal
    return sign | static_cast<uint8_t>(a / pow2(1 - s.bias - s.man_bits));
  const int man = static_cast<int>(a / pow2(e - s.man_bits)) - (1 << s.man_bits);
  return sign | static_cast<uint8_t>(((e + s.bias) << s.man_bits) | man);
}

}  // namespace mt
