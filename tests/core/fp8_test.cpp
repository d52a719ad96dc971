#include "core/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace mt {
namespace {

// The OCP v1.0 value of a code, written from the specification's table independently of
// core/fp8.cpp: (-1)^S * 2^(E - bias) * (1 + M / 2^m), subnormals 2^(1 - bias) * (M / 2^m).
double ocp_value(int code, int exp_bits, int man_bits, bool ieee_specials) {
  const int bias = (1 << (exp_bits - 1)) - 1;
  const int S = code >> 7, E = (code >> man_bits) & ((1 << exp_bits) - 1), M = code & ((1 << man_bits) - 1);
  const int emax_field = (1 << exp_bits) - 1;
  double v;
  if (ieee_specials && E == emax_field) v = M == 0 ? INFINITY : NAN;
  else if (!ieee_specials && E == emax_field && M == (1 << man_bits) - 1) v = NAN;
  else if (E == 0) v = std::ldexp(M, 1 - bias - man_bits);
  else v = std::ldexp((1 << man_bits) + M, E - bias - man_bits);
  return S ? -v : v;
}

void check_all_codes(Fp8Format f, int exp_bits, int man_bits, bool ieee) {
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = ocp_value(c, exp_bits, man_bits, ieee);
    const float got = fp8_decode(static_cast<uint8_t>(c), f);
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_TRUE(std::isnan(fp8_round(got, f)));
      EXPECT_EQ(fp8_encode(got, f) & 0x7f, 0x7f) << "NaN encodes to the all-ones NaN code, code " << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), want) << fp8_format_name(f) << " code " << c;
    if (std::isinf(want)) {  // E5M2's infinities saturate on the way back in (satfinite)
      EXPECT_EQ(fp8_encode(got, f), (c & 0x80) | 0x7b);
      continue;
    }
    EXPECT_EQ(fp8_encode(got, f), c) << fp8_format_name(f) << " code " << c << " value " << got;
    EXPECT_EQ(fp8_round(got, f), got);
    EXPECT_EQ(std::signbit(fp8_round(got, f)), std::signbit(got));
  }
  EXPECT_EQ(nans, ieee ? 6 : 2);
}

TEST(Fp8, E4M3EveryCodeDecodesToItsOcpValueAndEncodesBack) { check_all_codes(Fp8Format::E4M3, 4, 3, false); }
TEST(Fp8, E5M2EveryCodeDecodesToItsOcpValueAndEncodesBack) { check_all_codes(Fp8Format::E5M2, 5, 2, true); }

TEST(Fp8, KnownCodes) {
  EXPECT_EQ(fp8_decode(0x7e, Fp8Format::E4M3), 448.f);
  EXPECT_EQ(fp8_decode(0x38, Fp8Format::E4M3), 1.f);
  EXPECT_EQ(fp8_decode(0x08, Fp8Format::E4M3), std::ldexp(1.f, -6));  // smallest normal
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::E4M3), std::ldexp(1.f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_decode(0x7b, Fp8Format::E5M2), 57344.f);
  EXPECT_EQ(fp8_decode(0x3c, Fp8Format::E5M2), 1.f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::E5M2), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_max(Fp8Format::E4M3), 448.f);
  EXPECT_EQ(fp8_max(Fp8Format::E5M2), 57344.f);
}

TEST(Fp8, RoundsToNearestWithTiesToEven) {
  const auto E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  // E4M3 around 1: spacing 1/8. 1 + 1/16 is a tie between 1 (even mantissa 0) and 1.125.
  EXPECT_EQ(fp8_round(1.0625f, E4), 1.f);
  EXPECT_EQ(fp8_round(1.1875f, E4), 1.25f);  // tie between 1.125 (odd) and 1.25 (even)
  EXPECT_EQ(fp8_round(std::nextafter(1.0625f, 2.f), E4), 1.125f);
  EXPECT_EQ(fp8_round(-1.0625f, E4), -1.f);
  // E5M2 around 1: spacing 1/4.
  EXPECT_EQ(fp8_round(1.125f, E5), 1.f);
  EXPECT_EQ(fp8_round(1.375f, E5), 1.5f);
  // Subnormals: E4M3's spacing 2^-9; half of the smallest subnormal ties to zero (even), just
  // above it rounds up; 1.5 x 2^-9 ties to 2 x 2^-9.
  EXPECT_EQ(fp8_round(std::ldexp(1.f, -10), E4), 0.f);
  EXPECT_EQ(fp8_round(std::nextafter(std::ldexp(1.f, -10), 1.f), E4), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_round(std::ldexp(3.f, -10), E4), std::ldexp(1.f, -8));
  EXPECT_EQ(fp8_encode(-std::ldexp(1.f, -11), E4), 0x80);  // underflow keeps the sign
  // The largest subnormal rounds up into the smallest normal: 7.5 x 2^-9 ties to 8 x 2^-9.
  EXPECT_EQ(fp8_encode(std::ldexp(15.f, -10), E4), 0x08);
  // Below the max: 432 lies midway between 416 and 448 (spacing 32): to 448 (even mantissa 6).
  EXPECT_EQ(fp8_round(432.f, E4), 448.f);
  EXPECT_EQ(fp8_round(400.f, E4), 384.f);  // tie between 384 (even 4) and 416 (odd 5)
}

TEST(Fp8, SaturatesToTheLargestFiniteValue) {
  const auto E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {448.f, 449.f, 464.f, 480.f, 1e6f, 3.4e38f, inf}) {
    EXPECT_EQ(fp8_round(v, E4), 448.f) << v;
    EXPECT_EQ(fp8_encode(v, E4), 0x7e) << v;
    EXPECT_EQ(fp8_encode(-v, E4), 0xfe) << v;
  }
  for (float v : {57344.f, 61440.f, 65536.f, 1e9f, inf}) {
    EXPECT_EQ(fp8_round(v, E5), 57344.f) << v;
    EXPECT_EQ(fp8_encode(v, E5), 0x7b) << v;
    EXPECT_EQ(fp8_encode(-v, E5), 0xfb) << v;
  }
}

TEST(Fp8, NaNStaysNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    EXPECT_EQ(fp8_encode(nan, f), 0x7f);
    EXPECT_EQ(fp8_encode(-nan, f), 0xff);
    EXPECT_TRUE(std::isnan(fp8_round(nan, f)));
    EXPECT_TRUE(std::isnan(fp8_decode(0xff, f)));
  }
}

TEST(Fp8, RoundMatchesEncodeDecodeOnManyValues) {
  // A sweep of magnitudes across both formats' ranges, midpoints included.
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int e = -20; e <= 17; ++e)
      for (int k = 0; k < 64; ++k) {
        const float x = std::ldexp(1.f + k / 64.f, e);
        EXPECT_EQ(fp8_round(x, f), fp8_decode(fp8_encode(x, f), f)) << x;
        EXPECT_EQ(fp8_round(-x, f), fp8_decode(fp8_encode(-x, f), f)) << -x;
      }
}

}  // namespace
}  // namespace mt
