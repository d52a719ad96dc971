// SGD against torch.optim.SGD's documented update, evaluated in double:
//   d = g + wd*p;  b = (t == 1) ? d : mu*b + d;  p -= lr*b
#include <gtest/gtest.h>

#include <vector>

#include "optim/optimizer.h"
#include "optim/test_util.h"

namespace mt::optim {
namespace {

using testing::expect_close;
using testing::vec;

OptimizerConfig sgd_config(float momentum) {
  OptimizerConfig cfg;
  cfg.type = "sgd";
  cfg.sgd_momentum = momentum;
  return cfg;
}

void run_three_steps(float momentum) {
  auto opt = make_optimizer(sgd_config(momentum), 4, {{1, 2, false}}, Device::CPU);
  const std::vector<float> p0 = {0.5f, -1.0f, 2.0f, 0.25f};
  Tensor p = vec(p0);
  std::vector<double> rp(p0.begin(), p0.end()), rb(4, 0.0);
  const std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f, 1.0f}, {-0.05f, 0.4f, 0.3f, -2.0f}, {0.2f, 0.0f, -0.6f, 0.5f}};
  const float lrs[3] = {0.1f, 0.05f, 0.025f};
  const double wd = 0.01;
  const double mu = momentum;
  const double mask[4] = {1, 0, 0, 1};
  for (int s = 0; s < 3; ++s) {
    opt->step(p, vec(grads[s]), lrs[s], static_cast<float>(wd), {});
    for (int i = 0; i < 4; ++i) {
      const double d = grads[s][i] + wd * mask[i] * rp[i];
      rb[i] = (s == 0) ? d : mu * rb[i] + d;
      rp[i] -= static_cast<double>(lrs[s]) * (mu != 0 ? rb[i] : d);
    }
  }
  for (int i = 0; i < 4; ++i) expect_close(p.data<float>()[i], rp[i]);
  auto st = opt->state();
  if (momentum == 0.0f) {
    EXPECT_TRUE(st.empty());
  } else {
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].name, "momentum_buffer");
    EXPECT_EQ(st[0].hi - st[0].lo, 4);
    for (int i = 0; i < 4; ++i) expect_close(st[0].value.data<float>()[i], rb[i]);
  }
}

TEST(SGD, ThreeStepsWithMomentumMatchFormula) { run_three_steps(0.9f); }
TEST(SGD, ThreeStepsWithoutMomentumMatchFormula) { run_three_steps(0.0f); }

TEST(SGD, RestoredBufferContinuesBitIdentically) {
  const int n = 64;
  std::vector<float> g(n);
  for (int i = 0; i < n; ++i) g[i] = 0.01f * static_cast<float>(i - 32);
  Tensor p = vec(std::vector<float>(n, 1.0f));
  auto a = make_optimizer(sgd_config(0.9f), n, {}, Device::CPU);
  a->step(p, vec(g), 0.1f, 0.01f, {});
  Tensor p2 = p.clone();
  auto b = make_optimizer(sgd_config(0.9f), n, {}, Device::CPU);
  b->state()[0].value.copy_from(a->state()[0].value);
  b->set_step_count(a->step_count());
  for (int s = 0; s < 2; ++s) {
    a->step(p, vec(g), 0.1f, 0.01f, {});
    b->step(p2, vec(g), 0.1f, 0.01f, {});
  }
  EXPECT_EQ(p.to_vector(), p2.to_vector());
}

}  // namespace
}  // namespace mt::optim
