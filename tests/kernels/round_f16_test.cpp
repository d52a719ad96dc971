// fp16 emulation: IEEE half rounding (nearest-even, subnormals, overflow to inf) of the CPU engine.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ops.h"

namespace mt::ops {
namespace {

TEST(RoundF16, LargestFiniteAndOverflowToInf) {
  EXPECT_EQ(round_f16(65504.f), 65504.f);
  EXPECT_EQ(round_f16(-65504.f), -65504.f);
  EXPECT_EQ(round_f16(65519.f), 65504.f);  // below the half-way point to 65536
  EXPECT_TRUE(std::isinf(round_f16(65520.f)) && round_f16(65520.f) > 0);  // the tie rounds up to 2^16: inf
  EXPECT_TRUE(std::isinf(round_f16(1e5f)));
  EXPECT_TRUE(std::isinf(round_f16(-3e38f)) && round_f16(-3e38f) < 0);
  EXPECT_TRUE(std::isinf(round_f16(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(round_f16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(RoundF16, TiesToEven) {
  const float u = std::ldexp(1.f, -10);  // spacing of fp16 values in [1, 2)
  EXPECT_EQ(round_f16(1.f + u / 2), 1.f);              // tie between 1 and 1+u: even is 1
  EXPECT_EQ(round_f16(1.f + 3 * u / 2), 1.f + 2 * u);  // tie between 1+u and 1+2u: even is 1+2u
  EXPECT_EQ(round_f16(1.f + u / 2 + u / 64), 1.f + u); // above the tie
  EXPECT_EQ(round_f16(2049.f), 2048.f);                // spacing 2 above 2048
  EXPECT_EQ(round_f16(2051.f), 2052.f);
  EXPECT_EQ(round_f16(0.1f), 0.0999755859375f);        // fp16's nearest to 0.1
}

TEST(RoundF16, Subnormals) {
  const float tiny = std::ldexp(1.f, -24);  // smallest subnormal
  EXPECT_EQ(round_f16(tiny), tiny);
  EXPECT_EQ(round_f16(std::ldexp(1.f, -14)), std::ldexp(1.f, -14));  // smallest normal
  EXPECT_EQ(round_f16(std::ldexp(1.f, -14) - tiny), std::ldexp(1.f, -14) - tiny);  // largest subnormal
  EXPECT_EQ(round_f16(tiny / 2), 0.f);                 // tie between 0 and tiny: even is 0
  EXPECT_EQ(round_f16(tiny / 2 * 1.01f), tiny);
  EXPECT_EQ(round_f16(1.5f * tiny), 2 * tiny);         // tie: even is 2 tiny
  EXPECT_EQ(round_f16(2.5f * tiny), 2 * tiny);
  EXPECT_EQ(round_f16(3.3f * tiny), 3 * tiny);
  EXPECT_EQ(round_f16(1e-9f), 0.f);
  EXPECT_TRUE(std::signbit(round_f16(-1e-9f)));        // underflow keeps the sign
}

TEST(RoundF16, InplaceRoundsEveryElement) {
  std::vector<float> v{1.f + std::ldexp(1.f, -11), 70000.f, 3.14159265f, -1e-9f, 0.f};
  Tensor t = Tensor::from_vector(v, {5});
  round_f16_inplace(t);
  const float* d = t.data<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = round_f16(v[i]);
    if (std::isinf(want)) EXPECT_TRUE(std::isinf(d[i]));
    else EXPECT_EQ(d[i], want) << i;
  }
  EXPECT_EQ(d[2], 3.140625f);
}

}  // namespace
}  // namespace mt::ops
