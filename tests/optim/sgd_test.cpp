// SGD against torch.optim.SGD's documented update, evaluated in double:
//   d = g + wd*p;  b = (t == 1) ? d : mu*b + d;  p -= lr*b
#include <gtest/gtest.h>

#include <vector>

#include "optim/optimizer.h"
#include "optim/test_util.h"

namespace mt::optim {
namespace {

using testing::expect_close;

OptimizerConfig sgd_config(float momentum) {
  OptimizerConfig cfg;
  cfg.type = "sgd";
  cfg.sgd_momentum = momentum;
  return cfg;
}

void run_three_steps(float momentum) {
  auto opt = make_optimizer(sgd_config(momentum), 4, {{1, 2, false}});
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<double> rp(p.begin(), p.end()), rb(4, 0.0);
  const std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f, 1.0f}, {-0.05f, 0.4f, 0.3f, -2.0f}, {0.2f, 0.0f, -0.6f, 0.5f}};
  const float lrs[3] = {0.1f, 0.05f, 0.025f};
  const double wd = 0.01;
  const double mu = momentum;
  const double mask[4] = {1, 0, 0, 1};
  for (int s = 0; s < 3; ++s) {
    opt->step(p.data(), grads[s].data(), lrs[s], static_cast<float>(wd));
    for (int i = 0; i < 4; ++i) {
      const double d = grads[s][i] + wd * mask[i] * rp[i];
      rb[i] = (s == 0) ? d : mu * rb[i] + d;
      rp[i] -= static_cast<double>(lrs[s]) * (mu != 0 ? rb[i] : d);
    }
  }
  for (int i = 0; i < 4; ++i) expect_close(p[i], rp[i]);
  auto st = opt->state();
  if (momentum == 0.0f) {
    EXPECT_TRUE(st.empty());
  } else {
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].first, "momentum_buffer");
    for (int i = 0; i < 4; ++i) expect_close((*st[0].second)[i], rb[i]);
  }
}

TEST(SGD, ThreeStepsWithMomentumMatchFormula) { run_three_steps(0.9f); }
TEST(SGD, ThreeStepsWithoutMomentumMatchFormula) { run_three_steps(0.0f); }

TEST(SGD, RestoredBufferContinuesBitIdentically) {
  const int n = 64;
  std::vector<float> p(n, 1.0f), g(n);
  for (int i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>(i - 32);
  auto a = make_optimizer(sgd_config(0.9f), n, {});
  a->step(p.data(), g.data(), 0.1f, 0.01f);
  std::vector<float> p2 = p;
  auto b = make_optimizer(sgd_config(0.9f), n, {});
  *b->state()[0].second = *a->state()[0].second;
  b->set_step_count(a->step_count());
  for (int s = 0; s < 2; ++s) {
    a->step(p.data(), g.data(), 0.1f, 0.01f);
    b->step(p2.data(), g.data(), 0.1f, 0.01f);
  }
  EXPECT_EQ(p, p2);
}

}  // namespace
}  // namespace mt::optim
