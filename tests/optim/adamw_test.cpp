// AdamW against the published update (torch.optim.AdamW docs) evaluated in double.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <vector>

#include "optim/optimizer.h"
#include "optim/test_util.h"

namespace mt::optim {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::vec;

struct RefAdamW {
  double b1, b2, eps;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g, double lr, const std::vector<double>& wd) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] -= lr * wd[i] * p[i];  // decoupled decay first
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

TEST(AdamW, ThreeStepsMatchFormulaWithDecayMask) {
  OptimizerConfig cfg;
  cfg.adam_beta1 = 0.9f;
  cfg.adam_beta2 = 0.95f;
  cfg.adam_eps = 1e-8f;
  // [0,2) decayed by span, [2,4) exempt, [4,6) uncovered (so decayed).
  std::vector<ParamSpan> spans = {{2, 2, false}, {0, 2, true}};
  auto opt = make_optimizer(cfg, 6, spans, Device::CPU);

  const std::vector<float> p0 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  Tensor p = vec(p0);
  RefAdamW ref{0.9, 0.95, 1e-8, {}, std::vector<double>(6, 0.0), std::vector<double>(6, 0.0)};
  ref.p.assign(p0.begin(), p0.end());

  const std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f, 1e-3f, -0.5f, 0.0f},
      {-0.05f, 0.4f, 0.3f, -2e-3f, 0.25f, 1.0f},
      {0.2f, 0.0f, -0.6f, 5e-4f, 0.125f, -0.5f}};
  const float lrs[3] = {1e-2f, 5e-3f, 2.5e-3f};
  const float wd = 0.1f;
  const std::vector<double> wd_mask = {wd, wd, 0, 0, wd, wd};
  for (int s = 0; s < 3; ++s) {
    opt->step(p, vec(grads[s]), lrs[s], wd, {});
    ref.step(std::vector<double>(grads[s].begin(), grads[s].end()), lrs[s], wd_mask);
  }
  EXPECT_EQ(opt->step_count(), 3);
  for (int64_t i = 0; i < p.numel(); ++i) expect_close(p.data<float>()[i], ref.p[i]);

  auto st = opt->state();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].name, "exp_avg");
  EXPECT_EQ(st[1].name, "exp_avg_sq");
  for (const auto& s : st) {
    EXPECT_EQ(s.lo, 0);
    EXPECT_EQ(s.hi, 6);
    EXPECT_EQ(s.value.device(), Device::CPU);
  }
  for (size_t i = 0; i < p0.size(); ++i) {
    expect_close(st[0].value.data<float>()[i], ref.m[i]);
    expect_close(st[1].value.data<float>()[i], ref.v[i], 1e-5);
  }
}

TEST(AdamW, FirstStepMovesEachParamByLr) {
  // With bias correction, step 1 gives mhat/sqrt(vhat) = sign(g): every param moves by lr
  // (eps aside), the classic check that the step count enters the correction.
  OptimizerConfig cfg;
  auto opt = make_optimizer(cfg, 3, {}, Device::CPU);
  Tensor p = vec({1.0f, 1.0f, 1.0f});
  opt->step(p, vec({3.0f, -0.01f, 100.0f}), 0.1f, 0.0f, {});
  expect_close(p.data<float>()[0], 0.9);
  expect_close(p.data<float>()[1], 1.1);
  expect_close(p.data<float>()[2], 0.9);
}

// The decoupled group (--decoupled-lr) steps with its own rate, weight decay included (torch's
// per-group lr enters 1 - lr * wd too); the moments and the step count are shared.
TEST(AdamW, DecoupledGroupStepsAtItsOwnRate) {
  OptimizerConfig cfg;
  cfg.adam_beta2 = 0.95f;
  // [0,2) decoupled and decayed, [2,3) decoupled without decay, [3,4) exempt, [4,6) uncovered.
  const std::vector<ParamSpan> spans = {{0, 2, true, true}, {2, 1, false, true}, {3, 1, false, false}};
  auto opt = make_optimizer(cfg, 6, spans, Device::CPU);
  const std::vector<float> p0 = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f};
  Tensor p = vec(p0);
  const double wd = 0.1;
  const std::vector<double> mask = {wd, wd, 0, 0, wd, wd};
  RefAdamW slow{0.9, 0.95, 1e-8, {p0.begin(), p0.end()}, std::vector<double>(6, 0.0), std::vector<double>(6, 0.0)};
  RefAdamW fast = slow;
  const std::vector<std::vector<float>> grads = {{0.1f, -0.2f, 0.3f, 1e-3f, -0.5f, 0.0f},
                                                 {-0.05f, 0.4f, 0.3f, -2e-3f, 0.25f, 1.0f}};
  const StepRates rates[2] = {{1e-2, 3e-2, wd}, {5e-3, 2e-2, wd}};
  for (int s = 0; s < 2; ++s) {
    opt->update(p, vec(grads[s]), rates[s], {});
    const std::vector<double> g(grads[s].begin(), grads[s].end());
    slow.step(g, rates[s].lr, mask);
    fast.step(g, rates[s].decoupled_lr, mask);
  }
  EXPECT_EQ(opt->step_count(), 2);
  for (int64_t i = 0; i < 6; ++i) expect_close(p.data<float>()[i], i < 3 ? fast.p[i] : slow.p[i]);
}

TEST(AdamW, RestoredStateContinuesBitIdentically) {
  OptimizerConfig cfg;
  const int64_t n = 1000;
  std::vector<float> p0(n);
  std::vector<std::vector<float>> g(4, std::vector<float>(n));
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = std::sin(0.1f * static_cast<float>(i));
    for (int s = 0; s < 4; ++s) g[s][i] = std::cos(0.37f * static_cast<float>(i * (s + 1)));
  }
  Tensor p = vec(p0);
  auto a = make_optimizer(cfg, n, {{0, 500, true}, {500, 500, false}}, Device::CPU);
  for (int s = 0; s < 2; ++s) a->step(p, vec(g[s]), 1e-3f, 0.1f, {});
  Tensor p2 = p.clone();

  // Through the state interface: the saved values written into a fresh optimizer's tensors.
  auto b = make_optimizer(cfg, n, {{0, 500, true}, {500, 500, false}}, Device::CPU);
  auto sa = a->state(), sb = b->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 0; k < sa.size(); ++k) sb[k].value.copy_from(sa[k].value);
  b->set_step_count(a->step_count());

  for (int s = 2; s < 4; ++s) {
    a->step(p, vec(g[s]), 1e-3f, 0.1f, {});
    b->step(p2, vec(g[s]), 1e-3f, 0.1f, {});
  }
  EXPECT_EQ(p.to_vector(), p2.to_vector());
}

TEST(AdamW, ResultIndependentOfThreadCount) {
  const int64_t n = 1 << 20;
  std::vector<float> g(n), p0(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = std::sin(0.001f * static_cast<float>(i)) * 1e-2f;
    p0[i] = std::cos(0.003f * static_cast<float>(i));
  }
  const std::vector<ParamSpan> spans = {{1000, 4096, false}, {300000, 77777, false}};
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    auto opt = make_optimizer(OptimizerConfig{}, n, spans, Device::CPU);
    Tensor p = vec(p0);
    for (int s = 0; s < 2; ++s) opt->step(p, vec(g), 1e-3f, 0.05f, {});
    return p.to_vector();
  };
  const int saved = omp_get_max_threads();
  const auto one = run(1), two = run(2);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
}

TEST(Optimizer, ValidationNamesTheFlag) {
  OptimizerConfig cfg;
  cfg.type = "lamb";
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--optimizer");
  cfg = {};
  cfg.adam_beta1 = 1.0f;
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--adam-beta1");
  cfg = {};
  cfg.adam_beta2 = -0.1f;
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--adam-beta2");
  cfg = {};
  cfg.adam_eps = -1e-8f;
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--adam-eps");
  cfg = {};
  cfg.weight_decay = -0.1f;
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--weight-decay");
  cfg = {};
  cfg.type = "sgd";
  cfg.sgd_momentum = -0.5f;
  expect_error([&] { make_optimizer(cfg, 4, {}, Device::CPU); }, "--sgd-momentum");
}

TEST(Optimizer, OverlappingSpansAreRejected) {
  EXPECT_THROW(make_optimizer(OptimizerConfig{}, 10, {{0, 5, true}, {4, 2, false}}, Device::CPU), mt::Error);
  EXPECT_THROW(make_optimizer(OptimizerConfig{}, 10, {{8, 5, true}}, Device::CPU), mt::Error);
}

}  // namespace
}  // namespace mt::optim
