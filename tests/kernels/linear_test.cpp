// Linear (OpenBLAS gemm) forward/backward against direct loops and finite differences.
#include <cblas.h>

#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

std::vector<double> naive_linear(const std::vector<double>& x, const std::vector<double>& w, const double* b,
                                 int64_t M, int64_t N, int64_t K) {
  std::vector<double> y(M * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = b ? b[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * w[n * K + k];
      y[m * N + n] = s;
    }
  return y;
}

TEST(Linear, ForwardMatchesNaive) {
  const int64_t M = 13, N = 7, K = 9;
  auto x = random_vec(M * K, 1), w = random_vec(N * K, 2), b = random_vec(N, 3);
  for (bool bias : {false, true}) {
    const auto ref = naive_linear(x, w, bias ? b.data() : nullptr, M, N, K);
    std::vector<double> y(M * N, 99.0);
    linear_forward(x.data(), w.data(), bias ? b.data() : nullptr, y.data(), M, N, K);
    EXPECT_LT(test::max_rel_err(y, ref), 1e-14);
    auto xf = test::to_float(x), wf = test::to_float(w), bf = test::to_float(b);
    std::vector<float> yf(M * N, 99.f);
    linear_forward(xf.data(), wf.data(), bias ? bf.data() : nullptr, yf.data(), M, N, K);
    EXPECT_LT(test::max_rel_err(yf, ref), 1e-6);
  }
}

TEST(Linear, EmptyInnerDimensionGivesBias) {
  std::vector<float> b = {1.f, 2.f}, y(6, 7.f);
  linear_forward(static_cast<const float*>(nullptr), nullptr, b.data(), y.data(), 3, 2, 0);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 1, 2, 1, 2}));
  linear_forward(static_cast<const float*>(nullptr), nullptr, nullptr, y.data(), 3, 2, 0);
  EXPECT_EQ(y, std::vector<float>(6, 0.f));
}

// dw and db start non-zero: backward must add to them, not overwrite.
TEST(Linear, GradCheckAndAccumulation) {
  const int64_t M = 6, N = 5, K = 4;
  auto x = random_vec(M * K, 4), w = random_vec(N * K, 5), b = random_vec(N, 6), r = random_vec(M * N, 7);
  const auto dw0 = random_vec(N * K, 8), db0 = random_vec(N, 9);
  std::vector<double> dx(M * K), dw = dw0, db = db0;
  linear_backward(r.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), M, N, K);
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  for (size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  auto loss = [&] {
    std::vector<double> y(M * N);
    linear_forward(x.data(), w.data(), b.data(), y.data(), M, N, K);
    return test::dot(y, r);
  };
  test::expect_grad("dx", x, dx, loss);
  test::expect_grad("dw", w, dw, loss);
  test::expect_grad("db", b, db, loss);

  // A second call adds the same gradient again; dx may be skipped.
  std::vector<double> dw2 = dw0, db2 = db0;
  linear_backward(r.data(), x.data(), w.data(), nullptr, dw2.data(), db2.data(), M, N, K);
  linear_backward(r.data(), x.data(), w.data(), nullptr, dw2.data(), db2.data(), M, N, K);
  for (size_t i = 0; i < dw2.size(); ++i) EXPECT_NEAR(dw2[i], dw0[i] + 2 * dw[i], 1e-12);
  for (size_t i = 0; i < db2.size(); ++i) EXPECT_NEAR(db2[i], db0[i] + 2 * db[i], 1e-12);
}

// Both thread pools vary: OpenMP (our gemm tiles, the bias reduction) and OpenBLAS (which the
// gemm must keep single-threaded inside a tile). The shapes give several tiles and edge tiles,
// and reduction lengths (K = 520, N = 700, M = 300) that OpenBLAS alone would split differently
// with 1 and several threads. Run also under OPENBLAS_CORETYPE=Haswell and Zen, whose edge
// kernels sum in another order than the main kernel (the test must pass for any kernel family).
TEST(Linear, BitIdenticalAcrossThreadCounts) {
  const int64_t M = 300, N = 700, K = 520;
  auto x = random_vec<float>(M * K, 10), w = random_vec<float>(N * K, 11), r = random_vec<float>(M * N, 12);
  auto b = random_vec<float>(N, 13);
  auto run = [&](int threads) {
    std::vector<float> y(M * N), dx(M * K), dw(N * K, 0.5f), db(N, 0.25f);
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(threads);
    test::with_threads(threads, [&] {
      linear_forward(x.data(), w.data(), b.data(), y.data(), M, N, K);
      linear_backward(r.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), M, N, K);
    });
    openblas_set_num_threads(blas_threads);
    return std::vector<std::vector<float>>{y, dx, dw, db};
  };
  const auto one = run(1);
  for (int t : {2, 3}) {
    const auto many = run(t);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], many[i])) << i;
  }
}

}  // namespace
}  // namespace mt::cpu
