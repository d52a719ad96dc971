// FP8 training on the GPU (real FP8 GEMMs through cuBLASLt, bf16 activations) against the CPU's
// exact emulation of the same recipe (fp32 activations): the losses track each other within
// bf16's drift, and the delayed recipe's scales after the run agree closely (their amaxes come
// from bf16 rather than fp32 activations, so not bit for bit; model/fp8_gemms_test.cpp checks
// the bookkeeping exactly on identical inputs).
#include <gtest/gtest.h>

#include <cmath>

#include "support/gpu.h"
#include "support/tiny_training.h"
#include "model/fp8.h"
#include "training/trainer.h"

namespace mt {
namespace {

using test::PatternSource;

constexpr int64_t kIters = 20;

// The tiny Llama 64 wide (every GEMM dimension a multiple of 16: the FP8 GEMMs' rule).
Arguments args(const std::string& device, model::Fp8Recipe recipe) {
  Arguments a = test::tiny_llama_args();
  a.model.hidden_size = 64;
  a.model.bf16 = true;
  a.model.fp8.enabled = true;
  a.model.fp8.hybrid = true;
  a.model.fp8.recipe = recipe;
  a.model.fp8.amax_history_len = 4;
  a.model.fp8.amax_max = true;
  a.train_iters = kIters;
  a.device = device;
  validate_args(a, 40);
  return a;
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> scales;  // every operand's scale at the end, in the store's order
  bool real = true;           // every FP8 linear ran the real-GEMM path
};

// emulate: the GPU runs the recipe's emulation instead of the real FP8 GEMMs.
TrainRun train(const Arguments& a, bool emulate = false) {
  Trainer t(a, nullptr);
  t.model().fp8()->real_gemms_off = emulate;
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  TrainRun r;
  for (int64_t i = 0; i < kIters; ++i) {
    auto s = t.train_step();
    r.losses.push_back(s.loss_sum / s.tokens);
  }
  for (model::Fp8LinearState& l : t.model().fp8()->linears()) {
    r.real = r.real && l.weight_codes.defined();
    for (model::Fp8TensorState* s : {&l.input, &l.weight, &l.grad})
      r.scales.push_back(s->scale.to_device(Device::CPU).to_vector()[0]);
  }
  return r;
}

void expect_tracks(model::Fp8Recipe recipe) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const TrainRun cpu = train(args("cpu", recipe)), gpu = train(args("cuda", recipe));
  EXPECT_TRUE(gpu.real);
  EXPECT_FALSE(cpu.real);  // the CPU emulates
  ASSERT_EQ(cpu.losses.size(), gpu.losses.size());
  double worst = 0;
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    const double d = std::abs(gpu.losses[i] - cpu.losses[i]) / cpu.losses[i];
    worst = std::max(worst, d);
    EXPECT_LT(d, 3e-2) << "iteration " << i + 1;
  }
  ASSERT_EQ(cpu.scales.size(), gpu.scales.size());
  double worst_scale = 0;
  for (size_t i = 0; i < cpu.scales.size(); ++i)
    worst_scale = std::max(worst_scale, std::abs(double(gpu.scales[i]) / cpu.scales[i] - 1));
  EXPECT_LT(worst_scale, 0.25);  // amaxes of diverging (bf16 vs fp32) activations
  std::printf("[ fp8 gpu ] %s: max relative loss difference %.2e over %lld steps, scales within %.2e\n",
              model::fp8_recipe_name(recipe), worst, static_cast<long long>(kIters), worst_scale);
}

// The FP8 producer fusion (model/fp8.h, fp8_producer_amax) changes no bit of training: the same
// losses and scales as the run whose casts all run unfused (MT_FP8_UNFUSED=1's switch).
// Tensorwise: RMSNorm and SwiGLU hand their outputs' amaxes to the casts (linear_qkv's, fc1's and
// fc2's inputs, fc1's output gradient); delayed: SwiGLU and its backward write fc2's input and
// fc1's output gradient as FP8 codes themselves.
void expect_fusion_changes_nothing(model::Fp8Recipe recipe, int64_t fusions_per_layer) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const Arguments a = args("cuda", recipe);
  model::set_fp8_producer_amax(true);
  const int64_t before = model::fp8_producer_fusions();
  const TrainRun fused = train(a);
  const int64_t fusions = model::fp8_producer_fusions() - before;
  model::set_fp8_producer_amax(false);
  const TrainRun plain = train(a);
  model::set_fp8_producer_amax(true);
  EXPECT_EQ(model::fp8_producer_fusions() - before, fusions);  // none while off
  const int64_t micro_batches = kIters * (a.global_batch_size / a.micro_batch_size);
  EXPECT_GE(fusions, fusions_per_layer * a.model.num_layers * micro_batches);
  EXPECT_TRUE(fused.real && plain.real);
  EXPECT_EQ(fused.losses, plain.losses);
  EXPECT_EQ(fused.scales, plain.scales);
  std::printf("[ fp8 gpu ] %s producer fusion: %lld casts fused; losses and scales equal over %lld steps\n",
              model::fp8_recipe_name(recipe), static_cast<long long>(fusions), static_cast<long long>(kIters));
}
TEST(Fp8TrainingGpu, TensorwiseProducerFusionChangesNoBit) {
  expect_fusion_changes_nothing(model::Fp8Recipe::Tensorwise, 4);
}
TEST(Fp8TrainingGpu, DelayedProducerFusionChangesNoBit) { expect_fusion_changes_nothing(model::Fp8Recipe::Delayed, 2); }

// The opt-in switches of the GPU path's casts (model/fp8.h, Fp8Switches: the fused current scale,
// the transposed weight from the cached codes, SwiGLU backward's codes, the weight gradients left
// running on side streams) change no bit of tensorwise training either: the same losses and
// scales as the default path, with them all on.
TEST(Fp8TrainingGpu, TensorwiseOptInSwitchesChangeNoBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const Arguments a = args("cuda", model::Fp8Recipe::Tensorwise);
  model::set_fp8_producer_amax(true);
  const model::Fp8Switches before = model::fp8_switches();
  model::set_fp8_switches({});
  const TrainRun plain = train(a);
  model::set_fp8_switches({true, true, true, true});
  const int64_t fused_before = model::fp8_producer_fusions();
  const TrainRun switched = train(a);
  const int64_t fusions = model::fp8_producer_fusions() - fused_before;
  model::set_fp8_switches(before);
  EXPECT_TRUE(plain.real && switched.real);
  // Per layer and micro-batch: the three input amaxes and, now as codes, fc1's output gradient.
  const int64_t micro_batches = kIters * (a.global_batch_size / a.micro_batch_size);
  EXPECT_GE(fusions, 4 * a.model.num_layers * micro_batches);
  EXPECT_EQ(switched.losses, plain.losses);
  EXPECT_EQ(switched.scales, plain.scales);
}

TEST(Fp8TrainingGpu, DelayedTracksTheCpuEmulation) { expect_tracks(model::Fp8Recipe::Delayed); }
TEST(Fp8TrainingGpu, TensorwiseTracksTheCpuEmulation) { expect_tracks(model::Fp8Recipe::Tensorwise); }

// Blockwise: cuBLASLt's block-scaled GEMMs against the GPU's own emulation of the recipe (the same
// tiles quantized and read back, then bf16 GEMMs), both in bf16, so the two runs differ only in
// the GEMMs' accumulation. The tiles want every GEMM dimension a multiple of 128: the tiny Llama
// 128 wide (QKV 256, FFN 256), 64 tokens in micro-batches of 2; E4M3 throughout (Transformer
// Engine's blockwise default).
TEST(Fp8TrainingGpu, BlockwiseTracksTheGpuEmulation) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  Arguments a = test::tiny_llama_args();
  a.model.hidden_size = 128;
  a.model.ffn_hidden_size = 256;
  a.model.seq_length = 64;
  a.model.bf16 = true;
  a.model.fp8.enabled = true;
  a.model.fp8.recipe = model::Fp8Recipe::Blockwise;
  a.train_iters = kIters;
  a.device = "cuda";
  validate_args(a, 40);
  const auto real = train(a), emulated = train(a, true);
  EXPECT_TRUE(real.real);
  EXPECT_FALSE(emulated.real);
  double worst = 0;
  for (size_t i = 0; i < real.losses.size(); ++i) {
    const double d = std::abs(real.losses[i] - emulated.losses[i]) / emulated.losses[i];
    worst = std::max(worst, d);
    EXPECT_LT(d, 2e-2) << "iteration " << i + 1;
  }
  std::printf("[ fp8 gpu ] blockwise: max relative loss difference %.2e over %lld steps (first %.4f, last %.4f)\n",
              worst, static_cast<long long>(kIters), real.losses.front(), real.losses.back());
}

}  // namespace
}  // namespace mt
