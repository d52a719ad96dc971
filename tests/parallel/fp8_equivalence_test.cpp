// FP8 (emulated on the CPU) under tensor and data parallelism trains like one rank. Every rank
// quantizes with the scale of the whole tensor (amaxes reduced over TP, as Transformer Engine's
// amax reduction), so the FP8 values match the single rank's; what differs is fp32 summation
// order before a quantization, which can move an element across an FP8 rounding boundary (one
// FP8 step, 2^-3 relative for E4M3). Hence tolerances above fp32's: losses within 1e-3 relative
// over 20 steps, step-1 gradients within 2e-2 of the largest (measured: see the printed values).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "comm/multiprocess.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 20;
constexpr int32_t kVocab = 64;
constexpr double kLossTol = 1e-3, kGradTol = 2e-2;

struct Fp8Layout {
  int world = 1, tp = 1;
  bool sp = false;
  model::Fp8Recipe recipe = model::Fp8Recipe::Tensorwise;
  bool gemms = false;  // the GPU path's real FP8 GEMMs (model/fp8_gemms.cpp), run on the CPU
};

Arguments make_args(const Fp8Layout& l) {
  Arguments a;
  testing::set_layout_model(a, 2);
  testing::set_query_groups(a, 4);
  test::use_llama_blocks(a.model);
  testing::set_short_run(a, kSteps, 4, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.sequence_parallel = l.sp;
  a.model.fp8.enabled = true;
  a.model.fp8.hybrid = true;
  a.model.fp8.recipe = l.recipe;
  a.model.fp8.amax_history_len = 4;
  a.model.fp8.amax_max = true;
  validate_args(a, kVocab);
  return a;
}

testing::LayoutRun train(const Fp8Layout& l) {
  return [l](comm::World& w, const std::string& out, const std::string& ref) {
    Arguments a = make_args(l);
    parallel::RankGrid grid(w.size(), l.tp, 1);
    auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
    Trainer t(a, nullptr, pg);
    t.model().fp8()->real_gemms_on_cpu = l.gemms;
    t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
    const std::vector<double> losses = testing::train_checking_step1(t, kSteps, w.rank(), out, ref, kGradTol);
    for (const model::Fp8LinearState& s : t.model().fp8()->linears())  // the path asked for ran
      EXPECT_EQ(s.weight_codes.defined(), l.gemms) << s.name;
    if (w.rank() == 0) testing::write_losses(out + ".loss", losses);
  };
}

void expect_same_as_single_rank(const Fp8Layout& l) {
  const std::string& dir = testing::scratch_dir("mt_fp8_equiv");
  const std::string name = l.recipe == model::Fp8Recipe::Delayed ? "/ref_delayed" : "/ref_tensorwise";
  Fp8Layout one;
  one.recipe = l.recipe;
  const std::string& ref = testing::reference_run(dir + name, train(one));
  const std::string out = dir + "/run";
  std::remove((out + ".loss").c_str());
  testing::RankOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = testing::run_ranks(l.world, [&](comm::World& w) { train(l)(w, out, ref); }, o);
  ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, l.world));
  double worst = 0;
  std::vector<double> want;
  ASSERT_NO_FATAL_FAILURE(testing::expect_losses_match(ref, out, kSteps, kLossTol, 0.0, "single rank", worst, want));
  std::printf("[ fp8 layout ] %s%s world %d tp %d%s: max relative loss difference over %d steps %.2e\n",
              model::fp8_recipe_name(l.recipe), l.gemms ? " (FP8 GEMMs)" : "", l.world, l.tp, l.sp ? " sp" : "", kSteps, worst);
}

TEST(Fp8Equivalence, TP2Tensorwise) { expect_same_as_single_rank({.world = 2, .tp = 2}); }
TEST(Fp8Equivalence, TP2SequenceParallelDelayed) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .sp = true, .recipe = model::Fp8Recipe::Delayed});
}
// Data parallelism: each rank's micro-batches are the single rank's, quantized per tensor alike.
TEST(Fp8Equivalence, DP2Tensorwise) { expect_same_as_single_rank({.world = 2}); }
// The GPU path's FP8 GEMMs (real codes, scale_invs in the GEMM) train as the emulation, on one
// rank and under TP with sequence parallelism (gathered inputs re-cast in backward, row-parallel
// gradients gathered before their cast).
TEST(Fp8Equivalence, GemmPathOneRankDelayed) {
  expect_same_as_single_rank({.recipe = model::Fp8Recipe::Delayed, .gemms = true});
}
TEST(Fp8Equivalence, GemmPathTP2SequenceParallelTensorwise) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .sp = true, .gemms = true});
}

// Delayed scaling's amaxes reduce over data parallelism too (Megatron's amax group): both ranks
// end with the same scales although each quantized only its own micro-batches.
TEST(Fp8Equivalence, DP2DelayedRanksKeepOneScale) {
  const std::string dir = testing::scratch_dir("mt_fp8_dp_amax");
  Fp8Layout l{.world = 2, .recipe = model::Fp8Recipe::Delayed};
  auto res = testing::run_ranks(2, [&](comm::World& w) {
    Arguments a = make_args(l);
    a.train_iters = 4;
    parallel::RankGrid grid(w.size(), 1, 1);
    Trainer t(a, nullptr, parallel::build_process_groups(w, grid));
    t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
    for (int i = 0; i < 4; ++i) t.train_step();
    std::FILE* f = std::fopen((dir + "/scales" + std::to_string(w.rank())).c_str(), "w");
    for (model::Fp8LinearState& s : t.model().fp8()->linears())
      for (model::Fp8TensorState* ts : {&s.input, &s.weight, &s.grad})
        for (float v : ts->history.to_vector()) std::fprintf(f, "%a\n", v);
    std::fclose(f);
  });
  ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, 2));
  auto read = [&](int r) {
    std::ifstream in(dir + "/scales" + std::to_string(r));
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string r0 = read(0);
  EXPECT_GT(r0.size(), 100u);
  EXPECT_EQ(r0, read(1));
}

}  // namespace
}  // namespace mt
