// SwiGLU and GELU (erf and tanh forms): values and finite-difference gradients.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

TEST(SwiGlu, ForwardMatchesFormula) {
  const int64_t rows = 3, F = 5;
  auto x = random_vec(rows * 2 * F, 1, -4, 4);
  std::vector<double> y(rows * F);
  swiglu_forward(x.data(), y.data(), rows, F);
  auto xf = test::to_float(x);
  std::vector<float> yf(rows * F);
  swiglu_forward(xf.data(), yf.data(), rows, F);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j) {
      const double g = x[r * 2 * F + j], u = x[r * 2 * F + F + j];
      const double ref = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(y[r * F + j], ref, 1e-15 * (1 + std::abs(ref)));
      EXPECT_NEAR(yf[r * F + j], ref, 1e-6 * (1 + std::abs(ref)));
    }
}

TEST(SwiGlu, GradCheck) {
  const int64_t rows = 3, F = 4;
  auto x = random_vec(rows * 2 * F, 2, -4, 4), r = random_vec(rows * F, 3);
  std::vector<double> dx(x.size());
  swiglu_backward(r.data(), x.data(), dx.data(), rows, F);
  test::expect_grad("dx", x, dx, [&] {
    std::vector<double> y(rows * F);
    swiglu_forward(x.data(), y.data(), rows, F);
    return test::dot(y, r);
  });
}

TEST(Gelu, KnownValues) {
  const std::vector<double> x = {-2.0, -0.5, 0.0, 1.0, 3.0};
  std::vector<double> exact(x.size()), approx(x.size());
  gelu_forward(x.data(), exact.data(), 5, false);
  gelu_forward(x.data(), approx.data(), 5, true);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(exact[i], 0.5 * v * std::erfc(-v / std::sqrt(2.0)), 1e-15);
    EXPECT_NEAR(approx[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-15);
  }
  EXPECT_NEAR(exact[3], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(approx[3], 0.8411919906082768, 1e-15);
  std::vector<float> xf = {1.f}, yf(1);
  gelu_forward(xf.data(), yf.data(), 1, false);
  EXPECT_NEAR(yf[0], 0.8413447460685429, 1e-7);
}

TEST(Gelu, GradCheck) {
  for (bool tanh_approx : {false, true}) {
    SCOPED_TRACE(tanh_approx ? "tanh" : "erf");
    const int64_t n = 25;
    auto x = random_vec(n, 4, -5, 5), r = random_vec(n, 5);
    std::vector<double> dx(n);
    gelu_backward(r.data(), x.data(), dx.data(), n, tanh_approx);
    test::expect_grad("dx", x, dx, [&] {
      std::vector<double> y(n);
      gelu_forward(x.data(), y.data(), n, tanh_approx);
      return test::dot(y, r);
    });
  }
}

}  // namespace
}  // namespace mt::cpu
