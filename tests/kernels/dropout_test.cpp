// Philox dropout: documented mask, keep ratio, inverted scaling, the same mask in backward,
// and thread-count invariance.
#include "core/philox.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

TEST(Dropout, MaskFollowsPhiloxAndKeepRatio) {
  for (float p : {0.1f, 0.5f}) {
    const int64_t n = 200003;
    const uint64_t seed = 77, offset = 5;
    auto x = random_vec<float>(n, 1, 0.5, 1.5);  // nonzero, so y == 0 means dropped
    std::vector<float> y(n);
    dropout_forward(x.data(), y.data(), n, p, seed, offset);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = Philox::uniform(seed, offset, static_cast<uint64_t>(i)) >= p;
      kept += keep;
      ASSERT_EQ(y[i], keep ? x[i] * (1.f / (1.f - p)) : 0.f) << i;
    }
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.005);
  }
}

TEST(Dropout, BackwardUsesSameMask) {
  const int64_t n = 10007;
  const float p = 0.3f;
  auto x = random_vec<float>(n, 2, 0.5, 1.5), dy = random_vec<float>(n, 3, 0.5, 1.5);
  std::vector<float> y(n), dx(n);
  dropout_forward(x.data(), y.data(), n, p, 9, 123);
  dropout_backward(dy.data(), dx.data(), n, p, 9, 123);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i] == 0.f, dx[i] == 0.f) << i;
    if (dx[i] != 0.f) {
      ASSERT_EQ(dx[i], dy[i] * (1.f / (1.f - p)));
    }
  }
  // Another offset draws another mask.
  std::vector<float> y2(n);
  dropout_forward(x.data(), y2.data(), n, p, 9, 124);
  EXPECT_NE(y, y2);
}

TEST(Dropout, EdgeProbabilities) {
  auto x = random_vec<float>(100, 4);
  std::vector<float> y(100, 5.f);
  dropout_forward(x.data(), y.data(), 100, 0.f, 1, 0);
  EXPECT_EQ(y, x);
  dropout_forward(x.data(), y.data(), 100, 1.f, 1, 0);
  EXPECT_EQ(y, std::vector<float>(100, 0.f));
}

TEST(Dropout, GradCheck) {
  const int64_t n = 30;
  auto x = random_vec(n, 5), r = random_vec(n, 6);
  std::vector<double> dx(n);
  dropout_backward(r.data(), dx.data(), n, 0.4f, 3, 8);
  test::expect_grad("dx", x, dx, [&] {
    std::vector<double> y(n);
    dropout_forward(x.data(), y.data(), n, 0.4f, 3, 8);
    return test::dot(y, r);
  });
}

TEST(Dropout, BitIdenticalAcrossThreadCounts) {
  const int64_t n = 100003;
  auto x = random_vec<float>(n, 7);
  auto run = [&](int threads) {
    std::vector<float> y(n), dx(n);
    test::with_threads(threads, [&] {
      dropout_forward(x.data(), y.data(), n, 0.2f, 11, 13);
      dropout_backward(x.data(), dx.data(), n, 0.2f, 11, 13);
    });
    return std::vector<std::vector<float>>{y, dx};
  };
  const auto one = run(1), two = run(2);
  EXPECT_TRUE(test::bit_equal(one[0], two[0]));
  EXPECT_TRUE(test::bit_equal(one[1], two[1]));
}

}  // namespace
}  // namespace mt::cpu
