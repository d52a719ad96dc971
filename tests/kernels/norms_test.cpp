// RMSNorm and LayerNorm against direct formulas, finite differences (with accumulation of
// dw/db), and thread-count invariance of the row reductions.
#include <cmath>

#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

TEST(RmsNorm, ForwardMatchesNaive) {
  const int64_t rows = 5, dim = 11;
  const double eps = 1e-5;
  auto x = random_vec(rows * dim, 1, -3, 3), w = random_vec(dim, 2);
  std::vector<double> ref(rows * dim), rstd_ref(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += x[r * dim + j] * x[r * dim + j];
    rstd_ref[r] = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) ref[r * dim + j] = x[r * dim + j] * rstd_ref[r] * w[j];
  }
  std::vector<double> y(rows * dim), rstd(rows);
  rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, eps);
  EXPECT_LT(test::max_rel_err(y, ref), 1e-14);
  EXPECT_LT(test::max_rel_err(rstd, rstd_ref), 1e-14);
  auto xf = test::to_float(x), wf = test::to_float(w);
  std::vector<float> yf(rows * dim), rstdf(rows);
  rmsnorm_forward(xf.data(), wf.data(), yf.data(), rstdf.data(), rows, dim, 1e-5f);
  EXPECT_LT(test::max_rel_err(yf, ref), 1e-6);
}

TEST(RmsNorm, GradCheckAndAccumulation) {
  const int64_t rows = 4, dim = 7;
  auto x = random_vec(rows * dim, 3, -2, 2), w = random_vec(dim, 4, 0.5, 1.5), r = random_vec(rows * dim, 5);
  auto fwd = [&](std::vector<double>& y, std::vector<double>& rstd) {
    rmsnorm_forward(x.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5);
  };
  std::vector<double> y(rows * dim), rstd(rows);
  fwd(y, rstd);
  const auto dw0 = random_vec(dim, 6);
  std::vector<double> dx(rows * dim), dw = dw0;
  rmsnorm_backward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, dim);
  for (int64_t j = 0; j < dim; ++j) dw[j] -= dw0[j];
  auto loss = [&] {
    std::vector<double> yy(rows * dim), rr(rows);
    fwd(yy, rr);
    return test::dot(yy, r);
  };
  test::expect_grad("dx", x, dx, loss);
  test::expect_grad("dw", w, dw, loss);
}

TEST(LayerNorm, ForwardMatchesNaive) {
  const int64_t rows = 5, dim = 11;
  const double eps = 1e-5;
  auto x = random_vec(rows * dim, 7, 2, 6), w = random_vec(dim, 8), b = random_vec(dim, 9);
  std::vector<double> ref(rows * dim), mean_ref(rows), rstd_ref(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, ss = 0;
    for (int64_t j = 0; j < dim; ++j) s += x[r * dim + j];
    mean_ref[r] = s / dim;
    for (int64_t j = 0; j < dim; ++j) ss += std::pow(x[r * dim + j] - mean_ref[r], 2);
    rstd_ref[r] = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j) ref[r * dim + j] = (x[r * dim + j] - mean_ref[r]) * rstd_ref[r] * w[j] + b[j];
  }
  std::vector<double> y(rows * dim), mean(rows), rstd(rows);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, eps);
  EXPECT_LT(test::max_rel_err(y, ref), 1e-13);
  EXPECT_LT(test::max_rel_err(mean, mean_ref), 1e-15);
  EXPECT_LT(test::max_rel_err(rstd, rstd_ref), 1e-13);
  auto xf = test::to_float(x), wf = test::to_float(w), bf = test::to_float(b);
  std::vector<float> yf(rows * dim), meanf(rows), rstdf(rows);
  layernorm_forward(xf.data(), wf.data(), bf.data(), yf.data(), meanf.data(), rstdf.data(), rows, dim, 1e-5f);
  EXPECT_LT(test::max_rel_err(yf, ref), 2e-6);
}

TEST(LayerNorm, GradCheckAndAccumulation) {
  const int64_t rows = 4, dim = 7;
  auto x = random_vec(rows * dim, 10, -2, 2), w = random_vec(dim, 11, 0.5, 1.5), b = random_vec(dim, 12);
  auto r = random_vec(rows * dim, 13);
  std::vector<double> y(rows * dim), mean(rows), rstd(rows);
  layernorm_forward(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5);
  const auto dw0 = random_vec(dim, 14), db0 = random_vec(dim, 15);
  std::vector<double> dx(rows * dim), dw = dw0, db = db0;
  layernorm_backward(r.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), rows,
                     dim);
  for (int64_t j = 0; j < dim; ++j) {
    dw[j] -= dw0[j];
    db[j] -= db0[j];
  }
  auto loss = [&] {
    std::vector<double> yy(rows * dim), mm(rows), rr(rows);
    layernorm_forward(x.data(), w.data(), b.data(), yy.data(), mm.data(), rr.data(), rows, dim, 1e-5);
    return test::dot(yy, r);
  };
  test::expect_grad("dx", x, dx, loss);
  test::expect_grad("dw", w, dw, loss);
  test::expect_grad("db", b, db, loss);
}

// Large enough to take the threaded paths; dim not a multiple of the column block.
TEST(Norms, BitIdenticalAcrossThreadCounts) {
  const int64_t rows = 512, dim = 300;
  auto x = random_vec<float>(rows * dim, 16, -2, 2), w = random_vec<float>(dim, 17), b = random_vec<float>(dim, 18);
  auto dy = random_vec<float>(rows * dim, 19);
  auto run = [&](int threads) {
    std::vector<float> y1(rows * dim), y2(rows * dim), mean(rows), rstd1(rows), rstd2(rows), dx1(rows * dim),
        dx2(rows * dim), dw1(dim, 1.f), dw2(dim, 1.f), db(dim, 1.f);
    test::with_threads(threads, [&] {
      rmsnorm_forward(x.data(), w.data(), y1.data(), rstd1.data(), rows, dim, 1e-5f);
      rmsnorm_backward(dy.data(), x.data(), w.data(), rstd1.data(), dx1.data(), dw1.data(), rows, dim);
      layernorm_forward(x.data(), w.data(), b.data(), y2.data(), mean.data(), rstd2.data(), rows, dim, 1e-5f);
      layernorm_backward(dy.data(), x.data(), w.data(), mean.data(), rstd2.data(), dx2.data(), dw2.data(), db.data(),
                         rows, dim);
    });
    return std::vector<std::vector<float>>{y1, dx1, dw1, y2, dx2, dw2, db};
  };
  const auto one = run(1);
  for (int t : {2, 3}) {
    const auto many = run(t);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], many[i])) << i << " threads " << t;
  }
}

}  // namespace
}  // namespace mt::cpu
