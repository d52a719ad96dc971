// --fp16 on the CPU engine: fp16-rounded compute copy and activations, loss scaling (static and
// dynamic, Megatron's skip/back-off/grow rules), the scaler in checkpoints, the log line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

using test::PatternSource;

// The tiny Llama of trainer_test.cpp (support/tiny_training.h) for 30 iterations with cosine
// decay to 3e-4, a log line every iteration, fp16 or not and the given loss scaling.
Arguments args(bool fp16, const optim::GradScalerConfig& gs = {}, const std::string& save = "",
               const std::string& load = "") {
  Arguments a = test::tiny_llama_args(save, load);
  a.model.fp16 = fp16;
  a.grad_scaler = gs;
  a.train_iters = 30;
  a.lr_decay_style = "cosine";
  a.min_lr = 3e-4;
  a.log_interval = 1;
  validate_args(a, 40);
  return a;
}

optim::GradScalerConfig dynamic(double initial, int64_t window = 1000, int64_t hysteresis = 2) {
  optim::GradScalerConfig c;
  c.initial_loss_scale = initial;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  return c;
}

optim::GradScalerConfig fixed(double scale) {
  optim::GradScalerConfig c;
  c.loss_scale = scale;
  return c;
}

struct Step {
  double loss;
  bool skipped;
  float scale;  // after the step
};

std::vector<Step> train(Trainer& t, int64_t iters) {
  std::vector<Step> out;
  for (int64_t i = 0; i < iters; ++i) {
    auto r = t.train_step();
    out.push_back({r.loss_sum / r.tokens, r.skipped, t.grad_scaler() ? t.grad_scaler()->scale() : 1.f});
  }
  return out;
}

std::vector<Step> train(const Arguments& a, int64_t iters) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  auto s = train(t, iters);
  if (!a.save.empty()) t.save();
  return s;
}

TEST(Fp16, ComputeCopyIsFp16AndTrainingTracksFp32) {
  auto f32 = train(args(false), 30);
  Arguments a = args(true, dynamic(4096));
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  // The compute copy holds fp16 values of the fp32 main params (different buffers).
  auto& ps = t.model().params();
  ASSERT_NE(ps.model_buffer().raw(), ps.main_buffer().raw());
  const float* main = ps.main_buffer().data<float>();
  const float* model = ps.model_buffer().data<float>();
  int64_t differ = 0;
  for (int64_t i = 0; i < ps.numel(); ++i) {
    ASSERT_EQ(model[i], ops::round_f16(main[i])) << i;
    differ += model[i] != main[i];
  }
  EXPECT_GT(differ, ps.numel() / 2);
  auto f16 = train(t, 30);
  for (size_t i = 0; i < f16.size(); ++i) {
    EXPECT_FALSE(f16[i].skipped) << i;
    EXPECT_NEAR(f16[i].loss, f32[i].loss, 2e-2 * f32[i].loss) << i;
    EXPECT_NE(f16[i].loss, f32[i].loss) << i;  // fp16 rounding is really on
  }
  EXPECT_LT(f16.back().loss, 0.9 * f16.front().loss);
  EXPECT_EQ(t.state().skipped_iterations, 0);
  EXPECT_EQ(t.grad_scaler()->scale(), 4096.f);  // 30 clean steps < the window of 1000
}

TEST(Fp16, HugeInitialScaleSkipsAndBacksOffUntilStepsSucceed) {
  Arguments a = args(true, dynamic(std::ldexp(1.0, 40)));
  a.train_iters = 40;
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  testing::internal::CaptureStdout();
  t.run();
  const std::string out = testing::internal::GetCapturedStdout();
  // Read back every log line: scale, skipped count, whether a grad norm is given.
  std::regex re(R"(iteration +(\d+)/ +40 \|.*lm loss: ([0-9.E+-]+) \| loss scale: ([0-9.]+) \|( grad norm: [0-9.]+ \|)? )"
                R"(number of skipped iterations: +(\d+) \| number of nan iterations: +(\d+) \|)");
  std::vector<double> scale;
  std::vector<int64_t> skipped;
  std::vector<bool> has_norm;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    EXPECT_EQ(std::stol(m[1]), static_cast<long>(scale.size() + 1)) << line;
    EXPECT_TRUE(std::isfinite(std::stod(m[2]))) << line;
    scale.push_back(std::stod(m[3]));
    has_norm.push_back(m[4].matched);
    // The log line counts per interval (Megatron): one iteration per line here.
    const long in_line = std::stol(m[5]);
    EXPECT_LE(in_line, 1) << line;
    skipped.push_back((skipped.empty() ? 0 : skipped.back()) + in_line);
    EXPECT_EQ(std::stol(m[6]), 0) << line;  // the loss itself stays finite: no nan iterations
  }
  ASSERT_EQ(scale.size(), 40u) << out;
  EXPECT_NE(out.find("loss scale: 1099511627776.0 |"), std::string::npos);  // Megatron's {:.1f}
  // Iteration 1 overflows: hysteresis 2 keeps the scale; iteration 2 exhausts it and halves;
  // from then on every overflow halves, until a step fits in fp16.
  EXPECT_EQ(scale[0], std::ldexp(1.0, 40));
  EXPECT_EQ(scale[1], std::ldexp(1.0, 39));
  size_t k = 0;
  while (k < skipped.size() && skipped[k] == static_cast<int64_t>(k + 1)) ++k;
  ASSERT_GE(k, 3u);
  for (size_t i = 0; i < k; ++i) {
    EXPECT_EQ(scale[i], std::ldexp(1.0, 40 - static_cast<int>(i))) << i;
    EXPECT_FALSE(has_norm[i]) << i;  // a skipped step has no grad norm (Megatron's None)
  }
  // Replays Megatron's rules on the logged overflows: with the hysteresis spent, any later
  // overflow halves at once; no growth within the window of 1000.
  double want = std::ldexp(1.0, 40);
  int64_t hysteresis = 2, prev = 0;
  for (size_t i = 0; i < scale.size(); ++i) {
    const bool overflow = skipped[i] > prev;
    ASSERT_LE(skipped[i] - prev, 1) << i;
    prev = skipped[i];
    if (overflow && --hysteresis <= 0) want /= 2;
    EXPECT_EQ(scale[i], want) << i;
    EXPECT_EQ(has_norm[i], !overflow) << i;
  }
  ASSERT_LT(skipped.back(), 30);  // most steps succeed once the scale fits fp16
  const int64_t k_total = skipped.back();
  EXPECT_EQ(t.state().skipped_iterations, k_total);
  EXPECT_EQ(t.state().nan_iterations, 0);
  EXPECT_EQ(t.state().optimizer_steps, 40 - k_total);
  // Megatron's scheduler steps only on updates: skipped iterations leave the LR where it was.
  EXPECT_EQ(t.state().scheduler_samples, (40 - k_total) * a.global_batch_size);
  EXPECT_EQ(t.state().consumed_train_samples, 40 * a.global_batch_size);
  std::regex lr_re(R"(learning rate: ([0-9.E+-]+) \|)");
  std::vector<std::string> lrs;
  std::istringstream in2(out);
  for (std::string line; std::getline(in2, line);) {
    std::smatch m;
    if (line.find(" iteration ") != std::string::npos && std::regex_search(line, m, lr_re)) lrs.push_back(m[1]);
  }
  ASSERT_EQ(lrs.size(), 40u);
  for (size_t i = 1; i < k; ++i) EXPECT_EQ(lrs[i], lrs[0]) << "skipped iteration " << i + 1 << " moved the LR";
}

TEST(Fp16, GrowsAfterWindowOfCleanSteps) {
  auto s = train(args(true, dynamic(256, 5)), 12);
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_FALSE(s[i].skipped);
    EXPECT_EQ(s[i].scale, i < 4 ? 256.f : i < 9 ? 512.f : 1024.f) << i;
  }
}

TEST(Fp16, StaticPowerOfTwoScalesGiveIdenticalSteps) {
  // Scaling by 2^k and unscaling by 2^-k are exact in fp32 and commute with fp16 rounding while
  // nothing overflows or falls into fp16's subnormals: the results are bit-identical.
  auto a = train(args(true, fixed(256)), 10), b = train(args(true, fixed(4096)), 10);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << i;
    EXPECT_FALSE(a[i].skipped || b[i].skipped);
    EXPECT_EQ(a[i].scale, 256.f);
    EXPECT_EQ(b[i].scale, 4096.f);
  }
  // Without scaling small fp16 gradients underflow: close, but not the same.
  auto c = train(args(true, fixed(1)), 10);
  EXPECT_NEAR(c.back().loss, a.back().loss, 1e-2 * a.back().loss);
}

TEST(Fp16, ResumeEqualsUninterruptedWithScalerState) {
  fs::path dir = fs::temp_directory_path() / ("mt_fp16_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // Starting too high with a short window: skips, back-offs and growths before and after the
  // checkpoint, so a resume that lost the scaler state would diverge.
  const auto gs = dynamic(std::ldexp(1.0, 24), 3, 2);
  auto full = train(args(true, gs), 16);
  auto first = train(args(true, gs, dir.string()), 8);
  Trainer resumed(args(true, gs, "", dir.string()), nullptr);
  resumed.set_data(std::make_unique<PatternSource>(16), nullptr);
  resumed.load_for_test();
  EXPECT_EQ(resumed.state().iteration, 8);
  EXPECT_EQ(resumed.grad_scaler()->scale(), full[7].scale);
  auto rest = train(resumed, 8);
  int skips = 0;
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(first[static_cast<size_t>(i)].loss, full[static_cast<size_t>(i)].loss);
    skips += full[static_cast<size_t>(i)].skipped;
  }
  EXPECT_GT(skips, 0);
  for (int i = 0; i < 8; ++i) {
    const auto& f = full[static_cast<size_t>(8 + i)];
    EXPECT_EQ(rest[static_cast<size_t>(i)].loss, f.loss) << i;
    EXPECT_EQ(rest[static_cast<size_t>(i)].skipped, f.skipped) << i;
    EXPECT_EQ(rest[static_cast<size_t>(i)].scale, f.scale) << i;
  }
  // The state is in state.json under Megatron's names.
  auto st = checkpoint::read_state(dir.string(), 8);
  ASSERT_TRUE(st.grad_scaler.has_value());
  EXPECT_EQ(st.grad_scaler->scale, full[7].scale);
  fs::remove_all(dir);
}

TEST(Fp16, CheckpointWithoutScalerLoadsWithDefaults) {
  fs::path dir = fs::temp_directory_path() / ("mt_fp16_old_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train(args(false, {}, dir.string()), 2);  // an fp32 checkpoint: no scaler saved
  EXPECT_FALSE(checkpoint::read_state(dir.string(), 2).grad_scaler.has_value());
  Trainer t(args(true, dynamic(1024), "", dir.string()), nullptr);
  t.load_for_test();
  EXPECT_EQ(t.state().iteration, 2);
  EXPECT_EQ(t.grad_scaler()->scale(), 1024.f);
  EXPECT_EQ(t.grad_scaler()->state().hysteresis_tracker, 2);
  fs::remove_all(dir);
}

TEST(Fp16, FlagRules) {
  auto err = [](std::vector<std::string> flags) { return test::pretrain_args_error(flags); };
  EXPECT_NE(err({"--fp16", "--bf16"}).find("--fp16 and --bf16 cannot be used together"), std::string::npos);
  EXPECT_NE(err({"--loss-scale", "128"}).find("--loss-scale needs --fp16"), std::string::npos);
  EXPECT_NE(err({"--bf16", "--hysteresis", "3"}).find("--hysteresis needs --fp16"), std::string::npos);
  EXPECT_NE(err({"--fp16", "--hysteresis", "0"}).find("--hysteresis must be > 0"), std::string::npos);
  EXPECT_NE(err({"--fp16", "--min-loss-scale", "8", "--initial-loss-scale", "4"}).find("must not exceed"),
            std::string::npos);
  EXPECT_EQ(err({"--fp16", "--loss-scale", "1024"}), "");
  Arguments a = parse_pretrain_args({"--fp16", "--seq-length", "16"});
  EXPECT_TRUE(a.model.fp16);
  EXPECT_EQ(a.grad_scaler.initial_loss_scale, 4294967296.0);  // Megatron's defaults
  EXPECT_EQ(a.grad_scaler.min_loss_scale, 1.0);
  EXPECT_EQ(a.grad_scaler.loss_scale_window, 1000);
  EXPECT_EQ(a.grad_scaler.hysteresis, 2);
  EXPECT_EQ(a.grad_scaler.loss_scale, 0.0);  // unset: dynamic
}

}  // namespace
}  // namespace mt
