// --apply-layernorm-1p (Norm::one_plus): the weight is stored as w - 1 and starts at zero; the norm
// scales by 1 + w. Checked against a double-precision reference of Megatron's zero-centred-gamma
// norm, with the gradients against central differences of that reference, on the CPU and (test
// names with Gpu) on the GPU against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "kernels/test_util.h"
#include "model/layers.h"
#include "support/gpu.h"

namespace mt::model {
namespace {

constexpr int64_t kRows = 3, kDim = 8;

struct Case {
  ParamStore ps;
  Norm norm;
  // The GPU keeps parameters only as a bf16 (fp16) model over fp32 main weights, as training does.
  explicit Case(bool rms, bool one_plus = true, Half half = Half::None, int64_t dim = kDim) {
    TransformerConfig cfg;
    cfg.hidden_size = dim;
    cfg.normalization = rms ? "RMSNorm" : "LayerNorm";
    cfg.layernorm_zero_centered_gamma = one_plus;
    cfg.norm_epsilon = 1e-5f;
    norm.build(ps, "n", cfg);
    ps.allocate(half);
    ps.initialize(1, 0.02f, 1);
  }
};

std::vector<double> pattern(int64_t n, double a, double b) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = std::sin(a * static_cast<double>(i) + b);
  return v;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Megatron's norm with a zero-centred gamma, in double: y = normalise(x) * (1 + w) (+ b).
std::vector<double> reference(bool rms, const std::vector<double>& x, const std::vector<double>& w,
                              const std::vector<double>& b) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < kRows; ++r) {
    const double* xr = x.data() + r * kDim;
    double mean = 0, var = 0;
    if (!rms)
      for (int64_t j = 0; j < kDim; ++j) mean += xr[j] / kDim;
    for (int64_t j = 0; j < kDim; ++j) var += (xr[j] - mean) * (xr[j] - mean) / kDim;
    const double rs = 1.0 / std::sqrt(var + 1e-5);
    for (int64_t j = 0; j < kDim; ++j)
      y[static_cast<size_t>(r * kDim + j)] = (xr[j] - mean) * rs * (1.0 + w[static_cast<size_t>(j)]) + (rms ? 0.0 : b[static_cast<size_t>(j)]);
  }
  return y;
}

// Loss L = sum(y * g): dL/dy = g.
double loss(bool rms, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
            const std::vector<double>& g) {
  const auto y = reference(rms, x, w, b);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += y[i] * g[i];
  return l;
}

struct Result {
  std::vector<float> y, dx, dw;
};

// Forward and backward of the case's norm with w, b set, on device d.
Result run(Case& c, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
           const std::vector<double>& g, Device d, int64_t rows = kRows, int64_t dim = kDim) {
  c.norm.weight->main.copy_from(Tensor::from_vector(to_f(w), {dim}));
  if (c.norm.bias) c.norm.bias->main.copy_from(Tensor::from_vector(to_f(b), {dim}));
  c.ps.sync_model_from_main();  // the bias is read from the compute copy
  c.ps.zero_grad();
  if (d == Device::CUDA) c.ps.to_device(d);
  PassContext ctx;
  Norm::Saved s;
  // On the GPU activations are bf16, as in a bf16 run; results come back as f32.
  auto on = [d](const Tensor& t) { return d == Device::CPU ? t : t.to(DType::BF16).to_device(d); };
  auto back = [](const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32).to_vector(); };
  const Tensor xt = on(Tensor::from_vector(to_f(x), {rows, dim}));
  Result r;
  r.y = back(c.norm.forward(xt, s, ctx));
  r.dx = back(c.norm.backward(on(Tensor::from_vector(to_f(g), {rows, dim})), s, ctx));
  r.dw = c.norm.weight->grad.to_device(Device::CPU).to_vector();
  return r;
}

TEST(Norm1p, StoredWeightStartsAtZeroAndTheNormIsTheUsualOneThen) {
  for (bool rms : {true, false}) {
    Case one(rms), plain(rms, false);
    EXPECT_EQ(one.norm.weight->main.to_vector(), std::vector<float>(kDim, 0.f));
    EXPECT_EQ(plain.norm.weight->main.to_vector(), std::vector<float>(kDim, 1.f));
    const Tensor x = Tensor::from_vector(to_f(pattern(kRows * kDim, 0.7, 0.1)), {kRows, kDim});
    PassContext ctx;
    Norm::Saved a, b;
    EXPECT_EQ(one.norm.forward(x, a, ctx).to_vector(), plain.norm.forward(x, b, ctx).to_vector()) << rms;
  }
}

TEST(Norm1p, ForwardAndGradientsMatchTheReference) {
  for (bool rms : {true, false}) {
    Case c(rms);
    const auto x = pattern(kRows * kDim, 0.7, 0.1), w = pattern(kDim, 1.3, 0.5), b = pattern(kDim, 0.4, 2.0),
               g = pattern(kRows * kDim, 0.9, 1.0);
    const Result r = run(c, x, w, b, g, Device::CPU);
    const auto y = reference(rms, x, w, b);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(r.y[i], y[i], 1e-5) << rms << " y[" << i << "]";
    const double h = 1e-5;
    for (size_t i = 0; i < x.size(); ++i) {
      auto up = x, down = x;
      up[i] += h;
      down[i] -= h;
      EXPECT_NEAR(r.dx[i], (loss(rms, up, w, b, g) - loss(rms, down, w, b, g)) / (2 * h), 1e-4) << rms << " dx[" << i << "]";
    }
    for (size_t j = 0; j < w.size(); ++j) {
      auto up = w, down = w;
      up[j] += h;
      down[j] -= h;
      EXPECT_NEAR(r.dw[j], (loss(rms, x, up, b, g) - loss(rms, x, down, b, g)) / (2 * h), 1e-4) << rms << " dw[" << j << "]";
    }
  }
}

TEST(GpuNorm1p, MatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  test::gpu();
  // A bf16 model on the GPU (parameters move there only as bf16/fp16, as in training), at a
  // width the GPU kernels are built for; the CPU runs the same values in fp32.
  constexpr int64_t rows = 16, dim = 256;
  for (bool rms : {true, false}) {
    const auto x = pattern(rows * dim, 0.7, 0.1), w = pattern(dim, 1.3, 0.5), b = pattern(dim, 0.4, 2.0),
               g = pattern(rows * dim, 0.9, 1.0);
    Case cpu(rms, true, Half::None, dim), gpu(rms, true, Half::BF16, dim);
    const Result a = run(cpu, x, w, b, g, Device::CPU, rows, dim), r = run(gpu, x, w, b, g, Device::CUDA, rows, dim);
    // bf16 activations: within 2e-2 relative L2 (as the GPU norm ops' own cases). Ignoring the
    // stored weight's +1 would be off by order 1.
    EXPECT_LT(test::rel_l2(r.y, a.y), 2e-2) << rms;
    EXPECT_LT(test::rel_l2(r.dx, a.dx), 2e-2) << rms;
    EXPECT_LT(test::rel_l2(r.dw, a.dw), 2e-2) << rms;
  }
}

}  // namespace
}  // namespace mt::model
