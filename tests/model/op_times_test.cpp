// Per-op time breakdown: the formatted line adds up to the step time, nested scopes are
// exclusive, a model pass charges every op category, and on the GPU the scopes record CUDA
// events without waiting for the device (times appear only when resolved).
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include "core/error.h"
#include "model/gpt_model.h"
#ifdef MT_HAVE_CUDA
#include "kernels/ops.h"
#include "support/gpu.h"
#endif

namespace mt::model {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "name X.Y%" pairs of a breakdown line.
std::vector<std::pair<std::string, double>> percentages(const std::string& line) {
  std::vector<std::pair<std::string, double>> out;
  const std::regex re("([A-Za-z]+) ([0-9]+\\.[0-9])%");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), re); it != std::sregex_iterator(); ++it)
    out.emplace_back((*it)[1].str(), std::stod((*it)[2].str()));
  return out;
}

TEST(OpBreakdown, PercentagesOfTheStepAddUp) {
  OpTimes t;
  t.gemm = 2.0;
  t.attention = 1.0;
  t.norm = 0.5;
  t.elementwise = 0.25;
  t.loss = 0.25;
  t.optimizer = 0.5;
  t.communication = 0.5;
  const std::string line = format_op_breakdown(t, 10.0);
  const auto p = percentages(line);
  ASSERT_EQ(p.size(), 8u) << line;
  const std::vector<std::string> names = {"GEMM", "attention", "norms", "elementwise", "loss", "optimizer",
                                          "communication", "other"};
  const std::vector<double> want = {20.0, 10.0, 5.0, 2.5, 2.5, 5.0, 5.0, 50.0};
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].first, names[i]);
    EXPECT_NEAR(p[i].second, want[i], 0.051) << line;
    sum += p[i].second;
  }
  EXPECT_NEAR(sum, 100.0, 0.5) << line;
  EXPECT_NE(line.find("10.00 s"), std::string::npos) << line;

  // Without a step time the categories share the timed sum, and "other" is nothing.
  const auto q = percentages(format_op_breakdown(t, 0.0));
  EXPECT_NEAR(q[0].second, 40.0, 0.051);
  EXPECT_EQ(q.back().second, 0.0);
  t.reset();
  EXPECT_EQ(t.sum(), 0.0);
}

TEST(OpBreakdown, TimedOpsBeyondTheStepAreFlagged) {
  OpTimes t;
  t.gemm = 3.0;
  const std::string line = format_op_breakdown(t, 2.0);
  EXPECT_NE(line.find("other 0.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("exceed the step time"), std::string::npos) << line;
}

TEST(OpBreakdown, NestedScopesAreExclusive) {
  OpTimes t;
  const auto t0 = Clock::now();
  {
    ScopedOpTimer outer(&t, &OpTimes::attention);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    {
      ScopedOpTimer inner(&t, &OpTimes::norm);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const double wall = seconds_since(t0);
  EXPECT_GE(t.attention, 0.009);
  EXPECT_GE(t.norm, 0.009);
  // Counted once: nested time is not also charged to the enclosing scope.
  EXPECT_LE(t.attention + t.norm, wall);
  ScopedOpTimer off(nullptr, &OpTimes::gemm);  // timing off: nothing to do
}

TEST(OpBreakdown, ModelPassChargesEveryCategory) {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 64;
  c.orig_vocab_size = 64;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  GPTModel m(c);
  Batch b;
  b.B = 2;
  b.S = c.seq_length;
  for (int64_t i = 0; i < b.B * b.S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(i * 7 % 64));
    b.labels.push_back(static_cast<int32_t>(i * 5 % 64));
    b.loss_mask.push_back(1.f);
  }
  OpTimes t;
  RngState rng{1, 0};
  PassContext ctx;
  ctx.rng = &rng;
  ctx.times = &t;
  const auto t0 = Clock::now();
  GPTModel::Saved s;
  const LossSums l = m.forward(b, s, ctx);
  m.backward(s, static_cast<float>(1.0 / l.tokens), ctx);
  const double wall = seconds_since(t0);
  for (double v : {t.gemm, t.attention, t.norm, t.elementwise, t.loss}) EXPECT_GT(v, 0.0);
  EXPECT_LE(t.sum(), wall);
}

TEST(OpBreakdown, DeviceClockNeedsCuda) {
#ifdef MT_HAVE_CUDA
  GTEST_SKIP() << "CUDA build: covered by OpTimesGpu";
#else
  OpTimes t;
  EXPECT_THROW(t.set_device(Device::CUDA), Error);
  t.set_device(Device::CPU);
  EXPECT_FALSE(t.on_device());
#endif
}

TEST(OpTimesGpu, EventSpansTimeGpuOpsWithoutWaiting) {
#ifndef MT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const int64_t n = 8192;  // one GEMM is 1.1 TFLOP: milliseconds even on an H200
  const Tensor x = Tensor::zeros({n, n}, DType::BF16, Device::CUDA);
  const Tensor w = Tensor::zeros({n, n}, DType::BF16, Device::CUDA);
  const Tensor xn = Tensor::zeros({4096, 2048}, DType::BF16, Device::CUDA);
  const Tensor nw = Tensor::zeros({2048}, DType::BF16, Device::CUDA);
  auto gemm = [&] { Tensor y = ops::linear_forward(x, w, nullptr); };
  auto norm = [&] {
    Tensor rstd;
    Tensor y = ops::rmsnorm_forward(xn, nw, 1e-5f, rstd);
  };
  // cuBLASLt's algorithm choice and the memory pool's growth happen before the timed part.
  gemm();
  norm();
  test::gpu().synchronize();

  OpTimes t;
  t.set_device(Device::CUDA);
  ASSERT_TRUE(t.on_device());
  const int reps = 8;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    {
      ScopedOpTimer s(&t, &OpTimes::gemm);
      gemm();
    }
    ScopedOpTimer s(&t, &OpTimes::norm);
    norm();
  }
  // No scope waited for the GPU: the GEMMs are still queued and no time is known yet.
  EXPECT_FALSE(test::gpu().idle());
  EXPECT_EQ(t.gemm, 0.0);
  EXPECT_EQ(t.norm, 0.0);
  t.resolve();
  const double wall = seconds_since(t0);
  const double flops = 2.0 * static_cast<double>(n) * n * n * reps;
  EXPECT_GT(t.gemm, flops / 5e15);  // faster than 5 PFLOP/s would be implausible
  EXPECT_GT(t.norm, 0.0);
  EXPECT_LT(t.norm, t.gemm);  // 16 MiB through a norm against 8192^3 GEMMs
  EXPECT_LE(t.gemm + t.norm, wall);

  // The events are recycled: a second round adds to the totals.
  const double first = t.gemm;
  {
    ScopedOpTimer s(&t, &OpTimes::gemm);
    gemm();
  }
  EXPECT_EQ(t.gemm, first);
  t.resolve();
  EXPECT_GT(t.gemm, first);
  const auto p = percentages(format_op_breakdown(t, seconds_since(t0)));
  ASSERT_EQ(p.size(), 8u);
  EXPECT_GT(p[0].second, 0.0);
#endif
}

// The same model pass on the GPU, timed by events: every category the layers use gets time.
TEST(OpTimesGpu, ModelPassOnTheGpu) {
#ifndef MT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 128;
  c.num_attention_heads = 2;
  c.seq_length = 64;
  c.vocab_size = 256;
  c.orig_vocab_size = 256;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.bf16 = true;
  GPTModel m(c);
  m.to_device(Device::CUDA);
  Batch b;
  b.B = 2;
  b.S = c.seq_length;
  for (int64_t i = 0; i < b.B * b.S; ++i) {
    b.tokens.push_back(static_cast<int32_t>(i * 7 % 256));
    b.labels.push_back(static_cast<int32_t>(i * 5 % 256));
    b.loss_mask.push_back(1.f);
  }
  OpTimes t;
  t.set_device(Device::CUDA);
  RngState rng{1, 0};
  PassContext ctx;
  ctx.rng = &rng;
  ctx.times = &t;
  GPTModel::Saved s;
  const LossSums l = m.forward(b, s, ctx);
  m.backward(s, static_cast<float>(1.0 / std::max(l.tokens, 1.0)), ctx);
  t.resolve();
  for (double v : {t.gemm, t.attention, t.norm, t.elementwise, t.loss}) EXPECT_GT(v, 0.0);
#endif
}

}  // namespace
}  // namespace mt::model
