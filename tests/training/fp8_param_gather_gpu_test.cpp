// --fp8-param-gather on one GPU (the distributed optimizer over one rank: the FP8 weights are cast
// from the fp32 main values after each step and read by the real FP8 GEMMs, the data gradient's
// weight transposed from those codes) against the CPU path with the same flag (the exact
// emulation, fp32 activations) and against the GPU without the flag (the weight cast from the
// bf16 copy each step): losses within bf16's drift; the codes, byte for byte, the CPU's cast of
// the GPU's own fp32 main weight with the GPU's scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "kernels/ops.h"
#include "support/gpu.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

using test::PatternSource;

constexpr int64_t kIters = 12;

Arguments args(const std::string& device, model::Fp8Recipe recipe, bool gather) {
  Arguments a = test::tiny_llama_args();
  a.model.hidden_size = 64;  // every GEMM dimension a multiple of 16 (the FP8 GEMMs' rule)
  a.model.bf16 = true;
  a.model.fp8.enabled = true;
  a.model.fp8.hybrid = true;
  a.model.fp8.recipe = recipe;
  a.model.fp8.amax_history_len = 4;
  a.model.fp8.amax_max = true;
  a.model.fp8.param_gather = gather;
  a.use_distributed_optimizer = true;
  a.train_iters = kIters;
  a.device = device;
  validate_args(a, 40);
  return a;
}

struct Run {
  std::vector<double> losses;
  int64_t mismatched_codes = 0, codes = 0;
  bool real = true;
};

Run train(const Arguments& a) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  Run r;
  for (int64_t i = 0; i < kIters; ++i) {
    auto s = t.train_step();
    r.losses.push_back(s.loss_sum / s.tokens);
  }
  for (model::Fp8LinearState& l : t.model().fp8()->linears()) {
    r.real = r.real && l.weight_codes.defined();
    if (!l.param_gathered) continue;
    const model::Param* p = t.model().params().find(l.name + ".weight");
    const Tensor w = p->main.to_device(Device::CPU), scale = l.weight_scale.to_device(Device::CPU);
    Tensor want = Tensor::zeros(w.shape(), DType::U8), amax = Tensor::zeros({1}), sat = Tensor::zeros({1}, DType::I64);
    ops::fp8_cast_transpose(w, scale, Fp8Format::E4M3, want, nullptr, amax, sat);
    const Tensor got = l.weight_codes.to_device(Device::CPU);
    for (int64_t i = 0; i < w.numel(); ++i) r.mismatched_codes += got.data<uint8_t>()[i] != want.data<uint8_t>()[i];
    r.codes += w.numel();
  }
  return r;
}

double worst_difference(const Run& a, const Run& b) {
  double worst = 0;
  for (size_t i = 0; i < a.losses.size(); ++i)
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / b.losses[i]);
  return worst;
}

void expect_tracks(model::Fp8Recipe recipe) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const Run cpu = train(args("cpu", recipe, true)), gpu = train(args("cuda", recipe, true)),
            plain = train(args("cuda", recipe, false));
  EXPECT_TRUE(gpu.real);
  EXPECT_GT(gpu.codes, 0);
  EXPECT_EQ(gpu.mismatched_codes, 0);
  EXPECT_EQ(cpu.mismatched_codes, 0);
  const double vs_cpu = worst_difference(gpu, cpu), vs_plain = worst_difference(gpu, plain);
  EXPECT_LT(vs_cpu, 3e-2);
  EXPECT_LT(vs_plain, 3e-2);
  std::printf("[ fp8 param gather gpu ] %s: %lld codes exact; max relative loss difference over %lld steps: %.2e "
              "against the CPU, %.2e against the GPU without the flag\n",
              model::fp8_recipe_name(recipe), static_cast<long long>(gpu.codes), static_cast<long long>(kIters),
              vs_cpu, vs_plain);
}

TEST(Fp8ParamGatherGpu, TensorwiseTracksTheCpuWithExactCodes) { expect_tracks(model::Fp8Recipe::Tensorwise); }
TEST(Fp8ParamGatherGpu, DelayedTracksTheCpuWithExactCodes) { expect_tracks(model::Fp8Recipe::Delayed); }

}  // namespace
}  // namespace mt
