// --fp8-param-gather on CPU ranks over Gloo (FP8 emulated exactly, parallel/fp8_param_gather.h):
//  * the gathered codes of every FP8 weight are, byte for byte, one rank's cast of the full fp32
//    main weight with that scale, and a tensorwise scale is the full weight's (amaxes reduced
//    over the shards);
//  * the all-gather moves 1 byte per FP8 weight element where the main-value gather moves 4
//    (a bf16 gather 2), counted on the data-parallel group;
//  * losses: as DP=2 FP8 without the flag (bf16 model copy) up to the cast's double rounding
//    (fp32 -> bf16 -> fp8 there, fp32 -> fp8 here: an element now and then one FP8 step apart),
//    and as one rank with the flag within the DP tolerance of tests/parallel/fp8_equivalence_test;
//  * a checkpoint saved mid-run resumes to the uninterrupted run's losses bit for bit (delayed
//    scaling's deferred history update included).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "comm/multiprocess.h"
#include "core/fp8.h"
#include "kernels/fp8_scale.h"
#include "kernels/ops.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 12;
constexpr int32_t kVocab = 64;
// Measured (the printed values): up to 2.1e-4 (double rounding) and 2.5e-4 (DP against one rank).
constexpr double kDoubleRoundingTol = 2e-3, kDpTol = 1e-3;

// Counts what the all-gathers on the wrapped group receive, by element type.
class CountingComm final : public comm::Communicator {
 public:
  explicit CountingComm(comm::CommPtr c) : c_(std::move(c)) {}
  int64_t u8_bytes = 0, f32_bytes = 0;
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const std::vector<int>& world_ranks() const override { return c_->world_ranks(); }
  const std::string& name() const override { return c_->name(); }
  comm::WorkHandle all_reduce_async(void* b, size_t n, comm::DataType t, comm::ReduceOp op) override {
    return c_->all_reduce_async(b, n, t, op);
  }
  comm::WorkHandle reduce_scatter_async(const void* in, void* out, size_t n, comm::DataType t,
                                        comm::ReduceOp op) override {
    return c_->reduce_scatter_async(in, out, n, t, op);
  }
  comm::WorkHandle all_gather_async(const void* in, void* out, size_t n, comm::DataType t) override {
    const int64_t bytes = static_cast<int64_t>(n * comm::data_type_size(t)) * size();
    if (t == comm::DataType::U8) u8_bytes += bytes;
    if (t == comm::DataType::F32) f32_bytes += bytes;
    return c_->all_gather_async(in, out, n, t);
  }
  comm::WorkHandle broadcast_async(void* b, size_t n, comm::DataType t, int root) override {
    return c_->broadcast_async(b, n, t, root);
  }
  comm::WorkHandle all_to_all_async(const void* in, void* out, size_t n, comm::DataType t) override {
    return c_->all_to_all_async(in, out, n, t);
  }
  comm::WorkHandle all_to_all_v_async(const void* in, const std::vector<size_t>& sc, void* out,
                                      const std::vector<size_t>& rc, comm::DataType t) override {
    return c_->all_to_all_v_async(in, sc, out, rc, t);
  }
  comm::WorkHandle send_async(const void* b, size_t n, comm::DataType t, int peer) override {
    return c_->send_async(b, n, t, peer);
  }
  comm::WorkHandle recv_async(void* b, size_t n, comm::DataType t, int peer) override {
    return c_->recv_async(b, n, t, peer);
  }
  comm::WorkHandle barrier_async() override { return c_->barrier_async(); }
  void prepare_p2p(const std::vector<int>& peers) override { c_->prepare_p2p(peers); }

 private:
  comm::CommPtr c_;
};

struct GatherRun {
  int world = 2;
  bool gather = true;
  model::Fp8Recipe recipe = model::Fp8Recipe::Tensorwise;
  bool overlap = false;  // --overlap-param-gather (waits in the next forward)
};

Arguments make_args(const GatherRun& r, const std::string& save = "", const std::string& load = "") {
  Arguments a;
  testing::set_layout_model(a, 2);
  testing::set_query_groups(a, 4);
  test::use_llama_blocks(a.model);
  testing::set_short_run(a, kSteps, 4, 3e-3f, 3e-4);
  a.world_size = r.world;
  a.model.bf16 = true;  // the model's copy is bf16-rounded: what the flag's cast no longer goes through
  a.use_distributed_optimizer = true;
  a.ddp_bucket_size = 3000;  // several buckets, whose shards cut through the weights
  a.overlap_grad_reduce = r.overlap;
  a.overlap_param_gather = r.overlap;
  a.model.fp8.enabled = true;
  a.model.fp8.hybrid = true;
  a.model.fp8.recipe = r.recipe;
  a.model.fp8.amax_history_len = 4;
  a.model.fp8.amax_max = true;
  a.model.fp8.param_gather = r.gather;
  a.save = save;
  a.load = load;
  validate_args(a, kVocab);
  return a;
}

// The checks on one rank after its run: every gathered weight's codes against the full main
// weight cast here with the same scale; the tensorwise scale against the full weight's amax.
void check_codes(Trainer& t, const GatherRun& r) {
  t.data_parallel().gather_main_values();
  int checked = 0;
  for (model::Fp8LinearState& l : t.model().fp8()->linears()) {
    if (!l.param_gathered) throw Error(l.name + ": not FP8-gathered under --fp8-param-gather");
    const model::Param* p = t.model().params().find(l.name + ".weight");
    const Tensor& w = p->main;
    Tensor want = Tensor::zeros(w.shape(), DType::U8), amax = Tensor::zeros({1}), sat = Tensor::zeros({1}, DType::I64);
    ops::fp8_cast_transpose(w, l.weight_scale, Fp8Format::E4M3, want, nullptr, amax, sat);
    const uint8_t* g = l.weight_codes.data<uint8_t>();
    const uint8_t* e = want.data<uint8_t>();
    for (int64_t i = 0; i < w.numel(); ++i)
      if (g[i] != e[i])
        throw Error(fmt::format("{}: gathered code {} is {:#x}, a cast of the full weight gives {:#x}", l.name, i, g[i],
                                e[i]));
    if (r.recipe == model::Fp8Recipe::Tensorwise) {
      const float s = fp8::scale_from_amax(amax.to_vector()[0], fp8_max(Fp8Format::E4M3), 1.f);
      if (l.weight_scale.to_vector()[0] != s)
        throw Error(fmt::format("{}: scale {} is not the full weight's {}", l.name, l.weight_scale.to_vector()[0], s));
    }
    ++checked;
  }
  if (checked != 8) throw Error(fmt::format("{} FP8 weights checked, expected 8 (2 layers x 4 linears)", checked));
}

// Trains r, rank 0 writing its losses to out.loss and (with counts) the gather bytes per step
// and the FP8 buckets' elements to out.bytes.
void train(const GatherRun& r, const std::string& out, bool codes = false) {
  std::remove((out + ".loss").c_str());
  testing::RankOptions o;
  o.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = testing::run_ranks(
      r.world,
      [&](comm::World& w) {
        parallel::RankGrid grid(w.size(), 1, 1);
        auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
        auto counting = std::make_shared<CountingComm>(pg.dp_cp);
        pg.dp_cp = counting;
        Arguments a = make_args(r);
        Trainer t(a, nullptr, pg);
        t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
        const int64_t u8_before = counting->u8_bytes, f32_before = counting->f32_bytes;
        const std::vector<double> losses = testing::train_checking_step1(t, kSteps, w.rank(), out, "");
        const int64_t u8 = counting->u8_bytes - u8_before, f32 = counting->f32_bytes - f32_before;
        if (codes) check_codes(t, r);
        if (w.rank() != 0) return;
        testing::write_losses(out + ".loss", losses);
        int64_t fp8 = 0, other = 0;
        for (const parallel::Bucket& k : t.data_parallel().buckets()) (k.fp8 ? fp8 : other) += k.end - k.begin;
        std::ofstream f(out + ".bytes");
        f << u8 << " " << f32 << " " << fp8 << " " << other + fp8 << "\n";
      },
      o);
  ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, r.world));
}

std::vector<int64_t> read_bytes(const std::string& out) {
  std::ifstream f(out + ".bytes");
  std::vector<int64_t> v(4, -1);
  for (auto& x : v) f >> x;
  return v;
}

void expect_close(const std::string& a, const std::string& b, double tol, const char* what) {
  double worst = 0;
  std::vector<double> want;
  ASSERT_NO_FATAL_FAILURE(testing::expect_losses_match(b, a, kSteps, tol, 0.0, what, worst, want));
  std::printf("[ fp8 param gather ] against %s: max relative loss difference over %d steps %.2e (tolerance %.0e)\n",
              what, kSteps, worst, tol);
}

void gathers_the_single_rank_cast(model::Fp8Recipe recipe, bool overlap) {
  const std::string dir = testing::scratch_dir("mt_fp8_param_gather");
  const std::string name = std::string(model::fp8_recipe_name(recipe)) + (overlap ? "_overlap" : "");
  const std::string with = dir + "/with_" + name, without = dir + "/without_" + name, one = dir + "/one_" + name;
  ASSERT_NO_FATAL_FAILURE(train({.recipe = recipe, .overlap = overlap}, with, true));
  ASSERT_NO_FATAL_FAILURE(train({.gather = false, .recipe = recipe, .overlap = overlap}, without));
  ASSERT_NO_FATAL_FAILURE(train({.world = 1, .recipe = recipe}, one));
  expect_close(with, without, kDoubleRoundingTol, "DP=2 FP8 without --fp8-param-gather");
  expect_close(with, one, kDpTol, "one rank with --fp8-param-gather");
  // The bytes: without the flag every element is gathered as fp32 after each step; with it the
  // FP8 weights' elements as one byte each (after each step, and once before the first).
  const std::vector<int64_t> w = read_bytes(with), wo = read_bytes(without);
  const int64_t fp8 = w[2], all = w[3];
  ASSERT_GT(fp8, all / 2);  // the linears are most of the model
  EXPECT_EQ(wo[0], 0);
  EXPECT_EQ(wo[1], kSteps * all * 4);
  EXPECT_EQ(w[0], (kSteps + 1) * fp8);
  EXPECT_EQ(w[1], kSteps * (all - fp8) * 4);
  std::printf("[ fp8 param gather ] per step: %lld bytes of FP8 codes + %lld of fp32 main values, against %lld in "
              "fp32 (the FP8 weights: %lld bytes, %lld in bf16, %lld in fp32)\n",
              static_cast<long long>(fp8), static_cast<long long>((all - fp8) * 4), static_cast<long long>(all * 4),
              static_cast<long long>(fp8), static_cast<long long>(2 * fp8), static_cast<long long>(4 * fp8));
}

TEST(Fp8ParamGather, DP2TensorwiseGathersTheSingleRankCast) {
  gathers_the_single_rank_cast(model::Fp8Recipe::Tensorwise, false);
}
TEST(Fp8ParamGather, DP2DelayedOverlappedGathersTheSingleRankCast) {
  gathers_the_single_rank_cast(model::Fp8Recipe::Delayed, true);
}

// Save after 4 steps, resume for 4 more: the uninterrupted run's losses bit for bit (the loaded
// delayed scales and histories are those of the cast the checkpoint's weights were gathered with).
TEST(Fp8ParamGather, DP2CheckpointResumesBitIdentically) {
  const std::string dir = testing::scratch_dir("mt_fp8_param_gather_ckpt");
  const GatherRun r{.recipe = model::Fp8Recipe::Delayed};
  auto run = [&](int steps, int save_after, const std::string& save, const std::string& load, const std::string& out) {
    testing::RankOptions o;
    o.env = {{"OMP_NUM_THREADS", "1"}};
    auto res = testing::run_ranks(
        2,
        [&](comm::World& w) {
          Arguments a = make_args(r, save, load);
          parallel::RankGrid grid(w.size(), 1, 1);
          Trainer t(a, nullptr, parallel::build_process_groups(w, grid));
          t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
          t.load_for_test();
          std::vector<double> losses;
          for (int i = 0; i < steps; ++i) {
            auto s = t.train_step();
            losses.push_back(s.loss_sum / s.tokens);
            if (i + 1 == save_after) t.save();
          }
          if (w.rank() == 0) testing::write_losses(out, losses);
        },
        o);
    ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, 2));
  };
  ASSERT_NO_FATAL_FAILURE(run(8, 4, dir + "/ckpt", "", dir + "/straight"));
  ASSERT_NO_FATAL_FAILURE(run(4, 0, "", dir + "/ckpt", dir + "/resumed"));
  const std::vector<double> straight = testing::read_losses(dir + "/straight"),
                            resumed = testing::read_losses(dir + "/resumed");
  ASSERT_EQ(straight.size(), 8u);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(resumed[i], straight[4 + i]) << "step " << 5 + i;
}

}  // namespace
}  // namespace mt
