// Megatron's DynamicGradScaler / ConstantGradScaler transitions.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "optim/grad_scaler.h"
#include "optim/test_util.h"

namespace mt::optim {
namespace {

using testing::expect_error;

GradScalerConfig dyn(double initial, double min, int64_t window, int64_t hysteresis) {
  GradScalerConfig c;
  c.initial_loss_scale = initial;
  c.min_loss_scale = min;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  return c;
}

TEST(GradScaler, GrowsAfterWindowOfCleanSteps) {
  GradScaler s(dyn(65536, 1, 3, 2));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  // An overflow resets the growth count.
  s.update(false);
  s.update(false);
  s.update(true);  // hysteresis 2 -> 1: no backoff yet
  EXPECT_EQ(s.scale(), 131072.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 262144.0f);
}

TEST(GradScaler, BacksOffAfterHysteresisOverflows) {
  GradScaler s(dyn(1024, 1, 1000, 2));
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 1);
  // A clean step in between does not restore the hysteresis budget.
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  // Budget exhausted: every further overflow halves at once.
  s.update(true);
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, -1);
}

TEST(GradScaler, GrowthRestoresHysteresis) {
  GradScaler s(dyn(1024, 1, 2, 2));
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.state().hysteresis_tracker, 2);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0f);
}

TEST(GradScaler, NeverBelowMinScale) {
  GradScaler s(dyn(4, 2, 1000, 1));
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0f);
  GradScaler t(dyn(3, 2, 1000, 1));  // 3 * 0.5 = 1.5 clamps to 2
  t.update(true);
  EXPECT_EQ(t.scale(), 2.0f);
}

TEST(GradScaler, ConstantScaleIgnoresOverflowAndSavedState) {
  GradScalerConfig c;
  c.loss_scale = 128;
  GradScaler s(c);
  EXPECT_FALSE(s.dynamic());
  s.update(true);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 128.0f);
  s.load_state({4.0f, 3, 1});
  EXPECT_EQ(s.scale(), 128.0f);
}

TEST(GradScaler, SavedStateResumesIdentically) {
  GradScaler a(dyn(1024, 1, 3, 2));
  a.update(false);
  a.update(true);
  a.update(false);
  GradScaler b(dyn(1024, 1, 3, 2));
  b.load_state(a.state());
  for (bool inf : {false, false, true, true, false, false, false}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.state().growth_tracker, b.state().growth_tracker);
    EXPECT_EQ(a.state().hysteresis_tracker, b.state().hysteresis_tracker);
  }
  expect_error([&] { b.load_state({0.0f, 0, 0}); }, "loss scale");
}

TEST(GradScaler, ValidationNamesTheFlags) {
  expect_error([] { GradScaler s(dyn(1, 2, 10, 2)); }, "--min-loss-scale");
  expect_error([] { GradScaler s(dyn(8, 0, 10, 2)); }, "--min-loss-scale");
  expect_error([] { GradScaler s(dyn(0, 0, 10, 2)); }, "--initial-loss-scale");
  expect_error([] { GradScaler s(dyn(8, 1, 0, 2)); }, "--loss-scale-window");
  expect_error([] { GradScaler s(dyn(8, 1, 10, 0)); }, "--hysteresis");
  GradScalerConfig c;
  c.loss_scale = -4;
  expect_error([&] { GradScaler s(c); }, "--loss-scale");
}

}  // namespace
}  // namespace mt::optim
