// Every decay style of Megatron's OptimizerParamScheduler at chosen steps, against the
// formulas written out here (not re-derived from the implementation).
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "optim/lr_schedule.h"
#include "optim/test_util.h"

namespace mt::optim {
namespace {

using testing::expect_error;
constexpr double kPi = std::numbers::pi;

// warmup 100 samples from 1e-5 to 1e-3, decay over samples 100..1000 down to 1e-4.
LRScheduleConfig base(const std::string& style) {
  LRScheduleConfig c;
  c.max_lr = 1e-3;
  c.min_lr = 1e-4;
  c.lr_warmup_init = 1e-5;
  c.warmup_steps = 100;
  c.decay_steps = 1000;
  c.decay_style = style;
  return c;
}

void expect_warmup(const LRSchedule& s) {
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr(25), 1e-5 + (1e-3 - 1e-5) * 0.25);
  EXPECT_DOUBLE_EQ(s.lr(100), 1e-3);
}

TEST(LRSchedule, Linear) {
  LRSchedule s(base("linear"));
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr(101), 1e-4 + 9e-4 * (1.0 - 1.0 / 900.0));
  EXPECT_DOUBLE_EQ(s.lr(550), 5.5e-4);  // half way: (1e-3 + 1e-4) / 2
  EXPECT_DOUBLE_EQ(s.lr(1000), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr(1001), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr(100000), 1e-4);
}

TEST(LRSchedule, Cosine) {
  LRSchedule s(base("cosine"));
  expect_warmup(s);
  auto cosine = [](double ratio) { return 1e-4 + 9e-4 * 0.5 * (std::cos(kPi * ratio) + 1.0); };
  EXPECT_DOUBLE_EQ(s.lr(325), cosine(0.25));
  EXPECT_DOUBLE_EQ(s.lr(550), 5.5e-4);
  EXPECT_DOUBLE_EQ(s.lr(775), cosine(0.75));
  EXPECT_NEAR(s.lr(1000), 1e-4, 1e-18);
  EXPECT_DOUBLE_EQ(s.lr(2000), 1e-4);
}

TEST(LRSchedule, ConstantStaysAtMaxPastDecay) {
  LRSchedule s(base("constant"));
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr(500), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(5000), 1e-3);
}

TEST(LRSchedule, InverseSquareRoot) {
  LRSchedule s(base("inverse-square-root"));
  expect_warmup(s);
  EXPECT_DOUBLE_EQ(s.lr(400), 1e-3 * 10.0 / 20.0);  // max * sqrt(100)/sqrt(400)
  EXPECT_DOUBLE_EQ(s.lr(900), 1e-3 * 10.0 / 30.0);
  EXPECT_DOUBLE_EQ(s.lr(1001), 1e-4);
  // Floors at min_lr before decay_steps once max*sqrt(w/n) drops below it.
  LRScheduleConfig c = base("inverse-square-root");
  c.min_lr = 5e-4;
  c.decay_steps = 10000;
  LRSchedule f(c);
  EXPECT_DOUBLE_EQ(f.lr(1600), 5e-4);  // 1e-3 * 10/40 = 2.5e-4 < 5e-4
  EXPECT_DOUBLE_EQ(f.lr(256), 1e-3 * 10.0 / 16.0);
  // No warm-up: warmup and step counts are floored at 1.
  c = base("inverse-square-root");
  c.warmup_steps = 0;
  LRSchedule z(c);
  EXPECT_DOUBLE_EQ(z.lr(0), 1e-3);
  EXPECT_DOUBLE_EQ(z.lr(1), 1e-3);
  EXPECT_DOUBLE_EQ(z.lr(4), 5e-4);
}

TEST(LRSchedule, WSDEachAnnealStyle) {
  // Anneal over the last 200 of 1000 samples: stable at max until 800.
  auto make = [](const std::string& wsd_style) {
    LRScheduleConfig c = base("WSD");
    c.wsd_decay_steps = 200;
    c.wsd_decay_style = wsd_style;
    return LRSchedule(c);
  };
  const double d = 9e-4;
  for (const char* style : {"linear", "cosine", "exponential", "minus_sqrt"}) {
    SCOPED_TRACE(style);
    LRSchedule s = make(style);
    expect_warmup(s);
    EXPECT_DOUBLE_EQ(s.lr(500), 1e-3);
    EXPECT_DOUBLE_EQ(s.lr(800), 1e-3);
    EXPECT_DOUBLE_EQ(s.lr(1001), 1e-4);
  }
  // At 900 the anneal ratio is 0.5, at 850 it is 0.25.
  EXPECT_DOUBLE_EQ(make("linear").lr(900), 1e-4 + d * 0.5);
  EXPECT_DOUBLE_EQ(make("linear").lr(850), 1e-4 + d * 0.75);
  EXPECT_DOUBLE_EQ(make("cosine").lr(900), 1e-4 + d * 0.5);
  EXPECT_DOUBLE_EQ(make("cosine").lr(850), 1e-4 + d * 0.5 * (std::cos(kPi * 0.25) + 1.0));
  EXPECT_DOUBLE_EQ(make("exponential").lr(900), 1e-4 + d * (std::sqrt(2.0) - 1.0));  // 2*0.5^0.5 - 1
  EXPECT_DOUBLE_EQ(make("exponential").lr(850), 1e-4 + d * (2.0 * std::pow(0.5, 0.25) - 1.0));
  EXPECT_DOUBLE_EQ(make("minus_sqrt").lr(900), 1e-4 + d * (1.0 - std::sqrt(0.5)));
  EXPECT_DOUBLE_EQ(make("minus_sqrt").lr(850), 1e-4 + d * 0.5);
  for (const char* style : {"linear", "exponential", "minus_sqrt"}) EXPECT_DOUBLE_EQ(make(style).lr(1000), 1e-4);
  EXPECT_NEAR(make("cosine").lr(1000), 1e-4, 1e-18);
}

TEST(LRSchedule, NoWarmupStartsAtMax) {
  LRScheduleConfig c = base("linear");
  c.warmup_steps = 0;
  LRSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr(500), 1e-4 + 9e-4 * 0.5);
}

TEST(LRSchedule, WeightDecayIncrement) {
  LRScheduleConfig c = base("linear");
  c.start_wd = 0.01;
  c.end_wd = 0.1;
  c.wd_incr_steps = 1000;
  c.wd_incr_style = "linear";
  LRSchedule lin(c);
  EXPECT_DOUBLE_EQ(lin.weight_decay(0), 0.01);
  EXPECT_DOUBLE_EQ(lin.weight_decay(250), 0.01 + 0.25 * 0.09);
  EXPECT_DOUBLE_EQ(lin.weight_decay(1000), 0.1);
  EXPECT_DOUBLE_EQ(lin.weight_decay(5000), 0.1);
  c.wd_incr_style = "cosine";
  LRSchedule cos(c);
  EXPECT_DOUBLE_EQ(cos.weight_decay(0), 0.01);
  EXPECT_DOUBLE_EQ(cos.weight_decay(250), 0.01 + 0.09 * 0.5 * (std::cos(kPi * 0.75) + 1.0));
  EXPECT_DOUBLE_EQ(cos.weight_decay(500), 0.01 + 0.09 * 0.5);
  EXPECT_DOUBLE_EQ(cos.weight_decay(1000), 0.1);
  LRSchedule constant(base("linear"));  // start == end == 0.01
  EXPECT_DOUBLE_EQ(constant.weight_decay(0), 0.01);
  EXPECT_DOUBLE_EQ(constant.weight_decay(123456), 0.01);
}

TEST(LRSchedule, ValidationNamesTheFlags) {
  auto bad = [](auto edit, const std::string& flag) {
    LRScheduleConfig c = base("cosine");
    edit(c);
    expect_error([&] { LRSchedule s(c); }, flag);
  };
  bad([](LRScheduleConfig& c) { c.min_lr = 2e-3; }, "--min-lr");
  bad([](LRScheduleConfig& c) { c.min_lr = -1.0; }, "--min-lr");
  bad([](LRScheduleConfig& c) { c.lr_warmup_init = 2e-3; }, "--lr-warmup-init");
  bad([](LRScheduleConfig& c) { c.decay_steps = 0; }, "--lr-decay-iters");
  bad([](LRScheduleConfig& c) { c.warmup_steps = 1000; }, "--lr-warmup-iters");
  bad([](LRScheduleConfig& c) { c.warmup_steps = -1; }, "--lr-warmup-iters");
  bad([](LRScheduleConfig& c) { c.decay_style = "step"; }, "--lr-decay-style");
  bad([](LRScheduleConfig& c) { c.decay_style = "WSD"; }, "--lr-wsd-decay-iters");
  bad([](LRScheduleConfig& c) { c.decay_style = "WSD"; c.wsd_decay_steps = 2000; }, "--lr-wsd-decay-iters");
  bad([](LRScheduleConfig& c) {
        c.decay_style = "WSD";
        c.wsd_decay_steps = 10;
        // swap, not assignment: GCC 12 -O3 reports a false -Wrestrict on short literal assigns
        std::string style = "step";
        c.wsd_decay_style.swap(style);
      },
      "--lr-wsd-decay-style");
  bad([](LRScheduleConfig& c) { c.start_wd = -0.1; }, "--start-weight-decay");
  bad([](LRScheduleConfig& c) { c.end_wd = 0.001; c.wd_incr_style = "linear"; c.wd_incr_steps = 10; },
      "--end-weight-decay");
  bad([](LRScheduleConfig& c) { c.end_wd = 0.1; }, "--weight-decay-incr-style");
  bad([](LRScheduleConfig& c) { c.wd_incr_style = "step"; }, "--weight-decay-incr-style");
  bad([](LRScheduleConfig& c) { c.end_wd = 0.1; c.wd_incr_style = "linear"; }, "--train-iters");
}

}  // namespace
}  // namespace mt::optim

namespace mt::optim {
namespace {

// --decoupled-lr 5e-3 --decoupled-min-lr 5e-4 over base("cosine"): the embedding/output group
// follows the same warm-up (from the shared --lr-warmup-init) and cosine, between its own bounds;
// the default group is untouched. Values worked out by hand from Megatron's get_lr.
TEST(LRSchedule, DecoupledGroupSharesTheScheduleWithItsOwnBounds) {
  LRScheduleConfig c = base("cosine");
  c.decoupled_lr = 5e-3;
  c.decoupled_min_lr = 5e-4;
  LRSchedule s(c);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(0), 1e-5);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(25), 1.2575e-3);  // 1e-5 + (5e-3 - 1e-5) / 4
  EXPECT_DOUBLE_EQ(s.decoupled_lr(100), 5e-3);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(550), 2.75e-3);  // half way: (5e-3 + 5e-4) / 2
  EXPECT_DOUBLE_EQ(s.decoupled_lr(1000), 5e-4);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(5000), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr(550), 5.5e-4);  // the default group as without the flags
  EXPECT_DOUBLE_EQ(s.lr(100), 1e-3);

  c.decoupled_min_lr.reset();  // floor defaults to --min-lr (1e-4)
  LRSchedule t(c);
  EXPECT_DOUBLE_EQ(t.decoupled_lr(550), 2.55e-3);  // 1e-4 + (5e-3 - 1e-4) / 2
  EXPECT_DOUBLE_EQ(t.decoupled_lr(1001), 1e-4);

  c.decoupled_lr.reset();  // no decoupled group: both rates are --lr's
  LRSchedule u(c);
  for (int64_t n : {0, 50, 100, 550, 1000, 2000}) EXPECT_EQ(u.decoupled_lr(n), u.lr(n));
}

TEST(LRSchedule, DecoupledBoundsAreChecked) {
  LRScheduleConfig c = base("linear");
  c.decoupled_min_lr = 1e-4;
  testing::expect_error([&] { LRSchedule s(c); }, "--decoupled-min-lr needs --decoupled-lr");
  c.decoupled_lr = 5e-5;  // below its floor
  testing::expect_error([&] { LRSchedule s(c); }, "--decoupled-min-lr (0.0001, or --min-lr when unset)");
  c.decoupled_min_lr.reset();  // --min-lr 1e-4 is the floor, still above
  testing::expect_error([&] { LRSchedule s(c); }, "--decoupled-min-lr");
  c.decoupled_lr = 2e-4;
  LRSchedule ok(c);
  EXPECT_DOUBLE_EQ(ok.decoupled_lr(1000), 1e-4);
}

}  // namespace
}  // namespace mt::optim
