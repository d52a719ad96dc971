// Every parallel layout trains the same model to the same losses as one rank: for 20 steps the
// loss matches the single-rank run (fp32: 1e-5 relative), and after the first step every
// gradient element a rank holds matches the single-rank gradient at that position (TP shards
// are cut from the reference with the same split; with the distributed optimizer only the
// owned slices are reduced, so only those are compared). Ranks are forked processes talking
// over Gloo; the single-rank reference runs in a forked child as well, so this process never
// starts OpenMP threads before forking.
#include <gtest/gtest.h>

#include <cmath>

#include "comm/multiprocess.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 20;
constexpr int32_t kVocab = 64;  // a multiple of 16 x TP for TP <= 4: the padded vocabulary never changes

struct Layout {
  int world = 1, tp = 1;
  bool sp = false, dist_opt = false, overlap_grad = false, overlap_param = false, tp_overlap = false;
  int64_t bucket = 0;
  int64_t mbs = 4;  // the global batch is 8 whatever the layout; the micro-batch only regroups it
};

enum class Shape { Llama, Gpt };

Arguments make_args(Shape shape, const Layout& l) {
  Arguments a;
  auto& m = a.model;
  testing::set_layout_model(a, 2);
  if (shape == Shape::Llama) {
    testing::set_query_groups(a, 4);
    test::use_llama_blocks(m);
  } else {
    m.position_embedding_type = "learned_absolute";  // tied embeddings, LayerNorm, biases, GELU
  }
  // few micro-batches: fewer collectives, so the suite stays quick
  testing::set_short_run(a, kSteps, l.mbs, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.sequence_parallel = l.sp;
  a.use_distributed_optimizer = l.dist_opt;
  a.overlap_grad_reduce = l.overlap_grad;
  a.overlap_param_gather = l.overlap_param;
  a.tp_comm_overlap = l.tp_overlap;
  a.ddp_bucket_size = l.bucket;
  validate_args(a, kVocab);
  return a;
}

const std::string& tmp_dir() { return testing::scratch_dir("mt_equiv"); }

// Trains on this rank; rank 0 writes the losses, every rank compares its gradients after step 1
// with the reference (when given) and fails on a mismatch.
void train_rank(comm::World& w, Shape shape, const Layout& l, const std::string& out, const std::string& ref) {
  Arguments a = make_args(shape, l);
  parallel::RankGrid grid(w.size(), l.tp, 1);
  auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
  Trainer t(a, nullptr, pg);
  t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
  // Summation order differs across layouts: fp32 rounding relative to the largest gradient.
  const std::vector<double> losses = testing::train_checking_step1(t, kSteps, w.rank(), out, ref);
  if (w.rank() == 0) testing::write_losses(out + ".loss", losses);
}

void expect_same_as_single_rank(Shape shape, const Layout& l) {
  auto train = [shape](const Layout& layout) {
    return [shape, layout](comm::World& w, const std::string& out, const std::string& ref) {
      train_rank(w, shape, layout, out, ref);
    };
  };
  const std::string& ref =
      testing::reference_run(tmp_dir() + (shape == Shape::Llama ? "/ref_llama" : "/ref_gpt"), train(Layout{}));
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(testing::expect_layout_matches(ref, tmp_dir() + "/run", l.world, kSteps, train(l), worst));
  std::printf("[ layout ] world %d tp %d%s%s%s%s%s: max relative loss difference over %d steps %.2e\n", l.world, l.tp,
              l.sp ? " sp" : "", l.dist_opt ? " dist-opt" : "", l.overlap_grad ? " overlap-grad" : "",
              l.overlap_param ? " overlap-param" : "", l.tp_overlap ? " tp-comm-overlap" : "", kSteps, worst);
}

TEST(Equivalence, DP2) { expect_same_as_single_rank(Shape::Llama, {.world = 2}); }
TEST(Equivalence, DP2OverlapSmallBuckets) {
  expect_same_as_single_rank(Shape::Gpt, {.world = 2, .overlap_grad = true, .bucket = 3000});
}
TEST(Equivalence, DP2DistributedOptimizer) {
  expect_same_as_single_rank(Shape::Llama, {.world = 2, .dist_opt = true, .bucket = 5000});
}
TEST(Equivalence, DP4) { expect_same_as_single_rank(Shape::Gpt, {.world = 4, .bucket = 2000, .mbs = 2}); }
TEST(Equivalence, DP4DistributedOptimizerOverlap) {
  expect_same_as_single_rank(
      Shape::Llama,
      {.world = 4, .dist_opt = true, .overlap_grad = true, .overlap_param = true, .bucket = 4000, .mbs = 2});
}
TEST(Equivalence, TP2) { expect_same_as_single_rank(Shape::Llama, {.world = 2, .tp = 2}); }
TEST(Equivalence, TP4) { expect_same_as_single_rank(Shape::Llama, {.world = 4, .tp = 4}); }
TEST(Equivalence, TP2SequenceParallel) { expect_same_as_single_rank(Shape::Llama, {.world = 2, .tp = 2, .sp = true}); }
TEST(Equivalence, TP2SequenceParallelGpt) {
  expect_same_as_single_rank(Shape::Gpt, {.world = 2, .tp = 2, .sp = true});
}
// --tp-comm-overlap: the column-parallel GEMMs split by rows around the all-gather, and the
// backward's data and weight GEMMs split around the collectives (biases on the GPT shape).
TEST(Equivalence, TP2SequenceParallelCommOverlap) {
  expect_same_as_single_rank(Shape::Llama, {.world = 2, .tp = 2, .sp = true, .tp_overlap = true});
}
TEST(Equivalence, TP4SequenceParallelCommOverlapGpt) {
  expect_same_as_single_rank(Shape::Gpt, {.world = 4, .tp = 4, .sp = true, .tp_overlap = true});
}
TEST(Equivalence, TP2xDP2) { expect_same_as_single_rank(Shape::Gpt, {.world = 4, .tp = 2}); }
TEST(Equivalence, TP2xDP2SequenceParallelDistributedOptimizerOverlap) {
  expect_same_as_single_rank(Shape::Llama, {.world = 4, .tp = 2, .sp = true, .dist_opt = true, .overlap_grad = true,
                                            .overlap_param = true, .bucket = 3000});
}

}  // namespace
}  // namespace mt
