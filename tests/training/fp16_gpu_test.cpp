// --fp16 on the GPU against --fp16 on the CPU engine: the same tiny Llama trained with fp16
// compute copies and activations (real IEEE half on the GPU, rounded fp32 on the CPU), fp32 main
// params and grads, and the same loss scaler. The losses track each other loosely (the GPU rounds
// every stored intermediate to fp16, the CPU only the residual stream), and a huge initial loss
// scale makes both skip the same iterations and back off to the same scale, as the log lines say.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <regex>
#include <sstream>

#include "support/tiny_training.h"
#include "training/trainer.h"
#ifdef MT_HAVE_CUDA
#include "support/gpu.h"
#endif

namespace mt {
namespace {

using test::PatternSource;

#ifdef MT_HAVE_CUDA
// The test process's GPU context stands in for the one pretrain makes for a run.
#define MT_REQUIRE_GPU()                                           \
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible"; \
  test::gpu()
#else
#define MT_REQUIRE_GPU() GTEST_SKIP() << "built without the CUDA backend"
#endif

// The tiny Llama of fp16_test.cpp (30 iterations, cosine decay, a log line per iteration), on
// `device`, with head dim 16 (4 heads of a 64-wide model) and the given loss scaling.
Arguments args(const std::string& device, const optim::GradScalerConfig& gs, int64_t iters = 30) {
  Arguments a = test::tiny_llama_args();
  a.model.hidden_size = 64;
  a.model.fp16 = true;
  a.grad_scaler = gs;
  a.train_iters = iters;
  a.lr_decay_style = "cosine";
  a.min_lr = 3e-4;
  a.log_interval = 1;
  a.device = device;
  validate_args(a, 40);
  return a;
}

optim::GradScalerConfig dynamic(double initial, int64_t hysteresis = 2) {
  optim::GradScalerConfig c;
  c.initial_loss_scale = initial;
  c.hysteresis = hysteresis;
  return c;
}

struct Step {
  double loss;
  bool skipped;
  float scale;  // after the step
};

std::vector<Step> train(const Arguments& a, int64_t iters) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  std::vector<Step> out;
  for (int64_t i = 0; i < iters; ++i) {
    auto r = t.train_step();
    out.push_back({r.loss_sum / r.tokens, r.skipped, t.grad_scaler()->scale()});
  }
  EXPECT_EQ(t.model().params().model_buffer().dtype(), a.device == "cuda" ? DType::F16 : DType::F32);
  return out;
}

TEST(Fp16Gpu, TracksTheCpuFp16Run) {
  MT_REQUIRE_GPU();
  const auto cpu = train(args("cpu", dynamic(4096)), 30);
  const auto gpu = train(args("cuda", dynamic(4096)), 30);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_FALSE(gpu[i].skipped) << i;
    EXPECT_EQ(gpu[i].scale, 4096.f) << i;  // 30 clean steps, below the growth window
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, 2e-2 * cpu[i].loss) << i;
  }
  EXPECT_LT(gpu.back().loss, 0.9 * gpu.front().loss);
}

TEST(Fp16Gpu, StaticLossScaleTracksTheCpu) {
  MT_REQUIRE_GPU();
  optim::GradScalerConfig fixed;
  fixed.loss_scale = 1024;
  const auto cpu = train(args("cpu", fixed, 20), 20);
  const auto gpu = train(args("cuda", fixed, 20), 20);
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_FALSE(gpu[i].skipped) << i;
    EXPECT_EQ(gpu[i].scale, 1024.f) << i;
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, 2e-2 * cpu[i].loss) << i;
  }
}

// The log lines of a run: loss scale and skipped iterations (per line) of each iteration.
struct Logged {
  std::vector<double> scale;
  std::vector<long> skipped;
  long nan = 0;
};
Logged run_logged(const Arguments& a) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  testing::internal::CaptureStdout();
  t.run();
  const std::string out = testing::internal::GetCapturedStdout();
  std::regex re(R"(iteration +(\d+)/ +\d+ \|.*lm loss: ([0-9.E+-]+) \| loss scale: ([0-9.]+) \|)"
                R"(( grad norm: [0-9.]+ \|)? number of skipped iterations: +(\d+) \| )"
                R"(number of nan iterations: +(\d+) \|)");
  Logged l;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, re)) continue;
    l.scale.push_back(std::stod(m[3]));
    l.skipped.push_back(std::stol(m[5]));
    l.nan += std::stol(m[6]);
  }
  EXPECT_EQ(static_cast<long>(t.state().skipped_iterations),
            std::accumulate(l.skipped.begin(), l.skipped.end(), 0L));
  return l;
}

TEST(Fp16Gpu, HugeInitialScaleSkipsLikeTheCpu) {
  MT_REQUIRE_GPU();
  // 2^40 overflows fp16 at once; hysteresis 1 halves the scale on every overflow until a step
  // fits. The GPU must find the same overflows (its inf/nan check on the device) and log them.
  const auto cpu = run_logged(args("cpu", dynamic(std::ldexp(1.0, 40), 1), 40));
  const auto gpu = run_logged(args("cuda", dynamic(std::ldexp(1.0, 40), 1), 40));
  ASSERT_EQ(gpu.scale.size(), 40u);
  ASSERT_EQ(cpu.scale.size(), 40u);
  const long skipped = std::accumulate(gpu.skipped.begin(), gpu.skipped.end(), 0L);
  EXPECT_GT(skipped, 5);   // 2^40 is far above what fp16 gradients can hold
  EXPECT_LT(skipped, 30);  // and the scale comes down to one that fits
  EXPECT_LT(gpu.scale.back(), std::ldexp(1.0, 40));
  EXPECT_EQ(gpu.skipped, cpu.skipped);
  EXPECT_EQ(gpu.scale, cpu.scale);
  EXPECT_EQ(gpu.nan, 0);  // the loss itself stays finite
}

}  // namespace
}  // namespace mt
