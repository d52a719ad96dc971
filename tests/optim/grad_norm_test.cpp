#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include "optim/optimizer.h"

namespace mt::optim {
namespace {

TEST(GradNorm, SmallVectorExact) {
  const std::vector<float> g = {3.0f, -4.0f, 0.0f};
  EXPECT_EQ(grad_norm_squared(g.data(), 3), 25.0);
  EXPECT_EQ(grad_norm_squared(g.data(), 0), 0.0);
}

TEST(GradNorm, IdenticalForOneAndTwoThreads) {
  const int64_t n = 1 << 20;
  std::vector<float> g(n);
  long double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Values spanning several orders of magnitude make summation order visible in the bits.
    g[i] = std::sin(0.7f * static_cast<float>(i)) * std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);
    ref += static_cast<long double>(g[i]) * g[i];
  }
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = grad_norm_squared(g.data(), n);
  omp_set_num_threads(2);
  const double two = grad_norm_squared(g.data(), n);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
}

TEST(GradNorm, NonFiniteGradPropagates) {
  std::vector<float> g(100, 1.0f);
  g[37] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(grad_norm_squared(g.data(), 100)));
  g[37] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(grad_norm_squared(g.data(), 100)));
}

TEST(ClipGrads, ScalesByMaxNormOverNormPlusEps) {
  std::vector<float> g = {3.0f, -4.0f};
  const double norm = std::sqrt(grad_norm_squared(g.data(), 2));  // 5
  clip_grads(g.data(), 2, norm, 1.0);
  const double coeff = 1.0 / (5.0 + 1e-6);
  EXPECT_FLOAT_EQ(g[0], static_cast<float>(3.0 * coeff));
  EXPECT_FLOAT_EQ(g[1], static_cast<float>(-4.0 * coeff));
  EXPECT_NEAR(std::sqrt(grad_norm_squared(g.data(), 2)), 1.0, 1e-6);
}

TEST(ClipGrads, LeavesGradsAloneWhenCoeffNotBelowOne) {
  const std::vector<float> orig = {0.3f, -0.4f};
  std::vector<float> g = orig;
  clip_grads(g.data(), 2, 0.5, 1.0);
  EXPECT_EQ(g, orig);
  // Exactly at the boundary: coeff = max/(norm+1e-6) < 1, so Megatron does clip (slightly).
  clip_grads(g.data(), 2, 1.0, 1.0);
  EXPECT_LT(std::abs(g[0]), 0.3f);
  g = orig;
  clip_grads(g.data(), 2, std::numeric_limits<double>::quiet_NaN(), 1.0);
  EXPECT_EQ(g, orig);
}

}  // namespace
}  // namespace mt::optim
