// Rotate-half RoPE: tables, rotation against a direct pairwise formula (full and partial
// rotary dim), backward as the exact inverse and by finite differences.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

TEST(Rope, TablesMatchFormula) {
  const int64_t S = 9, rot = 6;
  const double base = 10000.0;
  std::vector<double> c(S * rot / 2), s(S * rot / 2);
  rope_tables(S, rot, base, c.data(), s.data());
  for (int64_t p = 0; p < S; ++p)
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double a = p * std::pow(base, -2.0 * i / rot);
      EXPECT_NEAR(c[p * rot / 2 + i], std::cos(a), 1e-15);
      EXPECT_NEAR(s[p * rot / 2 + i], std::sin(a), 1e-15);
    }
}

void check_forward(int64_t rot) {
  SCOPED_TRACE(testing::Message() << "rot_dim=" << rot);
  const int64_t B = 2, H = 3, S = 5, D = 8, half = rot / 2;
  const double base = 500000.0;
  auto x = random_vec(B * H * S * D, 1);
  std::vector<double> c(S * half), s(S * half);
  rope_tables(S, rot, base, c.data(), s.data());
  auto y = x;
  rope_forward(y.data(), c.data(), s.data(), B, H, S, D, rot);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t p = 0; p < S; ++p) {
      const double* xr = x.data() + (bh * S + p) * D;
      const double* yr = y.data() + (bh * S + p) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double a = p * std::pow(base, -2.0 * i / rot);
        EXPECT_NEAR(yr[i], xr[i] * std::cos(a) - xr[i + half] * std::sin(a), 1e-14);
        EXPECT_NEAR(yr[i + half], xr[i + half] * std::cos(a) + xr[i] * std::sin(a), 1e-14);
      }
      for (int64_t d = rot; d < D; ++d) EXPECT_EQ(yr[d], xr[d]);  // past rot_dim: untouched
    }
}

TEST(Rope, ForwardMatchesNaive) {
  check_forward(8);  // rotary percent 1
  check_forward(4);  // rotary percent 0.5
}

TEST(Rope, BackwardInvertsForwardAndGradCheck) {
  for (int64_t rot : {8, 4}) {
    const int64_t B = 1, H = 2, S = 4, D = 8;
    std::vector<double> c(S * rot / 2), s(S * rot / 2);
    rope_tables(S, rot, 10000.0, c.data(), s.data());
    auto x = random_vec(B * H * S * D, 2), r = random_vec(B * H * S * D, 3);
    auto y = x;
    rope_forward(y.data(), c.data(), s.data(), B, H, S, D, rot);
    rope_backward(y.data(), c.data(), s.data(), B, H, S, D, rot);
    EXPECT_LT(test::max_rel_err(y, x), 1e-15);
    auto dx = r;
    rope_backward(dx.data(), c.data(), s.data(), B, H, S, D, rot);
    test::expect_grad("dx", x, dx, [&] {
      auto yy = x;
      rope_forward(yy.data(), c.data(), s.data(), B, H, S, D, rot);
      return test::dot(yy, r);
    });
  }
}

TEST(Rope, FloatMatchesDouble) {
  const int64_t B = 2, H = 4, S = 300, D = 16, rot = 8;
  std::vector<double> c(S * rot / 2), s(S * rot / 2);
  std::vector<float> cf(S * rot / 2), sf(S * rot / 2);
  rope_tables(S, rot, 10000.0, c.data(), s.data());
  rope_tables(S, rot, 10000.0, cf.data(), sf.data());
  auto x = random_vec(B * H * S * D, 4);
  auto xf = test::to_float(x);
  rope_forward(x.data(), c.data(), s.data(), B, H, S, D, rot);
  rope_forward(xf.data(), cf.data(), sf.data(), B, H, S, D, rot);
  EXPECT_LT(test::max_rel_err(xf, x), 1e-6);
}

}  // namespace
}  // namespace mt::cpu
