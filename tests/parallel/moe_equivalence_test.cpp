// Expert parallelism trains the same MoE model to the same losses as one rank: a tiny Llama whose
// MLPs are MoE blocks (8 experts, top-2, load-balancing loss on, dropless, fp32) under EP 2 and 4
// with both token dispatchers, and EP composed with data parallelism and the distributed
// optimizer, tensor + sequence parallelism (expert TP 1 and = TP), and pipeline parallelism; and
// a second shape with a gated shared expert, sigmoid routing with DeepSeek-V3's expert bias
// (moved after each step from the token counts of every rank) and the z-loss; and MoE under
// context parallelism (the load-balancing counts and the tracker summed over TP x CP).
// As in equivalence_test.cpp: the per-step losses match the single-rank run (1e-5 relative) and
// after the first step every gradient element a rank holds (its experts by their global names,
// its TP/ETP shards, its owned slices) matches the single-rank gradient. Ranks are forked
// processes over Gloo.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "comm/multiprocess.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 12;
constexpr int32_t kVocab = 64;

struct Layout {
  int world = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  int etp = 1;  // expert TP (Megatron's default: TP)
  bool sp = false, dist_opt = false, overlap_grad = false, overlap_param = false;
  int64_t bucket = 0;
  std::string dispatcher = "allgather";
  bool rich = false;  // the second shape: shared expert and its gate, expert bias, z-loss
  bool shared_overlap = false;  // --moe-shared-expert-overlap (the shared expert during the exchange)
  // Recomputation (the same gradients): "moe" (selective: the MoE layer re-runs its dispatch in
  // backward) or "full" (uniform, one layer per group).
  std::string recompute = "";
  int layers = 2;  // model depth (interleaved PP needs PP x virtual stages layers)
  int vpp = 0;     // virtual stages per pipeline rank (interleaved 1F1B); 0: none
};

Arguments make_args(const Layout& l) {
  Arguments a;
  auto& m = a.model;
  testing::set_layout_model(a, l.layers);
  testing::set_query_groups(a, 4);
  test::use_llama_blocks(m);
  auto& moe = m.moe;
  moe.num_experts = 8;
  moe.topk = 2;
  moe.moe_ffn_hidden_size = 16;
  moe.aux_loss_coeff = 1e-2;
  moe.token_dispatcher = l.dispatcher;
  if (l.rich) {
    moe.shared_expert_intermediate_size = 24;
    moe.shared_expert_gate = true;
    moe.score_function = "sigmoid";
    moe.enable_expert_bias = true;
    moe.bias_update_rate = 1e-2;  // large enough to move the routing within the run
    moe.z_loss_coeff = 1e-3;
    moe.shared_expert_overlap = l.shared_overlap;
  }
  if (l.recompute == "moe") {
    m.recompute_granularity = "selective";
    m.recompute_modules = {"moe"};
  } else if (l.recompute == "full") {
    m.recompute_granularity = "full";
    m.recompute_method = "uniform";
    m.recompute_num_layers = 1;
    a.given.push_back("--recompute-num-layers");
  }
  // Micro-batches of 2 in every layout: the load-balancing loss is per micro-batch.
  testing::set_short_run(a, kSteps, 2, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.pipeline_model_parallel_size = l.pp;
  if (l.vpp > 0) a.num_virtual_stages_per_pipeline_rank = l.vpp;
  a.expert_model_parallel_size = l.ep;
  a.context_parallel_size = l.cp;
  a.expert_tensor_parallel_size = l.etp;
  a.sequence_parallel = l.sp;
  a.use_distributed_optimizer = l.dist_opt;
  a.overlap_grad_reduce = l.overlap_grad;
  a.overlap_param_gather = l.overlap_param;
  a.ddp_bucket_size = l.bucket;
  validate_args(a, kVocab);
  return a;
}

const std::string& tmp_dir() { return testing::scratch_dir("mt_moe_equiv"); }

void train_rank(comm::World& w, const Layout& l, const std::string& out, const std::string& ref) {
  Arguments a = make_args(l);
  parallel::RankGrid grid(w.size(), l.tp, l.pp, l.cp, l.ep, l.etp);
  auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid) : parallel::local_process_groups();
  Trainer t(a, nullptr, pg);
  t.set_data(std::make_unique<testing::PatternSource>(100000, a.model.seq_length, kVocab), nullptr);
  // The experts this rank holds are the EP share; their gradients match the reference's by name.
  int64_t experts = 0;
  for (const auto& p : t.model().params().params())
    experts += p.expert && p.name.find("layers.0.mlp.experts") != std::string::npos &&
               p.name.find("linear_fc1.weight") != std::string::npos;
  if (l.pp == 1 && experts != 8 / l.ep) throw Error(fmt::format("rank {} holds {} experts of layer 0", w.rank(), experts));
  std::vector<double> norms;
  const std::vector<double> losses = testing::train_checking_step1(t, kSteps, w.rank(), out, ref, 2e-6, {}, &norms);
  // Every rank has the global grad norm: each expert counted once, dense parameters once.
  if (!ref.empty()) {
    const std::vector<double> want = testing::read_losses(ref + ".norm");
    for (size_t i = 0; i < norms.size(); ++i)
      if (std::fabs(norms[i] - want.at(i)) > 1e-5 * want[i])
        throw Error(fmt::format("rank {}: step {} grad norm {} vs single rank {}", w.rank(), i + 1, norms[i], want[i]));
  }
  if (w.rank() == 0) {
    testing::write_losses(out + ".loss", losses);
    testing::write_losses(out + ".norm", norms);
  }
}

void expect_same_as_single_rank(const Layout& l) {
  auto train = [](const Layout& layout) {
    return [layout](comm::World& w, const std::string& out, const std::string& ref) { train_rank(w, layout, out, ref); };
  };
  const std::string ref_dir = tmp_dir() + (l.rich ? "/ref_rich" : "/ref") + (l.layers != 2 ? std::to_string(l.layers) : "");
  const std::string& ref = testing::reference_run(ref_dir, train({.rich = l.rich, .layers = l.layers}));
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(testing::expect_layout_matches(ref, tmp_dir() + "/run", l.world, kSteps, train(l), worst));
  std::printf("[ layout ] world %d tp %d pp %d (virtual %d) cp %d ep %d etp %d %s%s%s%s: max relative loss difference "
              "over %d steps %.2e\n",
              l.world, l.tp, l.pp, std::max(l.vpp, 1), l.cp, l.ep, l.etp, l.dispatcher.c_str(), l.sp ? " sp" : "", l.dist_opt ? " dist-opt" : "",
              l.rich ? " shared-expert+bias+z-loss" : "", kSteps, worst);
}

// Context parallelism: each CP rank routes its two chunks of every sequence.
TEST(MoEEquivalence, CP2) { expect_same_as_single_rank({.world = 2, .cp = 2}); }
TEST(MoEEquivalence, CP2xEP2AllToAll) {
  expect_same_as_single_rank({.world = 2, .ep = 2, .cp = 2, .dispatcher = "alltoall"});
}
TEST(MoEEquivalence, SharedExpertBiasZLossCP2xTP2SequenceParallel) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .cp = 2, .sp = true, .rich = true});
}
TEST(MoEEquivalence, EP2AllGather) { expect_same_as_single_rank({.world = 2, .ep = 2}); }
TEST(MoEEquivalence, EP2AllToAll) { expect_same_as_single_rank({.world = 2, .ep = 2, .dispatcher = "alltoall"}); }
TEST(MoEEquivalence, EP4AllGather) { expect_same_as_single_rank({.world = 4, .ep = 4}); }
TEST(MoEEquivalence, EP4AllToAll) { expect_same_as_single_rank({.world = 4, .ep = 4, .dispatcher = "alltoall"}); }
// EP 2 inside DP 4: each expert is replicated on 2 ranks (EDP 2), its gradient reduced and, with
// the distributed optimizer, sharded over them, while dense gradients go over all 4.
TEST(MoEEquivalence, EP2xEDP2DistributedOptimizer) {
  expect_same_as_single_rank({.world = 4, .ep = 2, .dist_opt = true, .bucket = 3000});
}
TEST(MoEEquivalence, EP2xEDP2DistributedOptimizerOverlapAllToAll) {
  expect_same_as_single_rank({.world = 4, .ep = 2, .dist_opt = true, .overlap_grad = true, .overlap_param = true,
                              .bucket = 2000, .dispatcher = "alltoall"});
}
// TP 2 + SP: each TP rank routes its own sequence shard. Expert TP 1: the experts are whole, EP
// spans the TP ranks; expert TP 2 (Megatron's default): fc1/fc2 split over the TP ranks.
TEST(MoEEquivalence, TP2SequenceParallelExpertTP1) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .sp = true});
}
// DP 1 but expert DP 2: the distributed optimizer shards the experts only (dense buckets whole).
TEST(MoEEquivalence, TP2SequenceParallelExpertTP1DistributedOptimizer) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .sp = true, .dist_opt = true, .overlap_param = true});
}
TEST(MoEEquivalence, TP2SequenceParallelExpertTP2) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .etp = 2, .sp = true});
}
TEST(MoEEquivalence, EP2xTP2SequenceParallelExpertTP1) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .sp = true});
}
TEST(MoEEquivalence, EP2xTP2SequenceParallelExpertTP1AllToAll) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .sp = true, .dispatcher = "alltoall"});
}
TEST(MoEEquivalence, TP2SequenceParallelExpertTP2AllToAll) {
  expect_same_as_single_rank({.world = 2, .tp = 2, .etp = 2, .sp = true, .dispatcher = "alltoall"});
}
TEST(MoEEquivalence, EP2xTP2SequenceParallelExpertTP2AllToAll) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .dispatcher = "alltoall"});
}
TEST(MoEEquivalence, EP2xTP2SequenceParallelExpertTP2DistributedOptimizer) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .dist_opt = true, .bucket = 3000});
}
// Expert TP without dense TP: the two DP ranks split each expert's fc1/fc2 between them.
TEST(MoEEquivalence, ExpertTP2OverDP2) { expect_same_as_single_rank({.world = 2, .etp = 2}); }
TEST(MoEEquivalence, ExpertTP2OverDP2AllToAll) {
  expect_same_as_single_rank({.world = 2, .etp = 2, .dispatcher = "alltoall"});
}
// Pipeline stages: each holds one MoE layer; the expert grad norm spans ETP x EP x PP.
TEST(MoEEquivalence, EP2xPP2) { expect_same_as_single_rank({.world = 4, .pp = 2, .ep = 2}); }
TEST(MoEEquivalence, EP2xPP2AllToAllDistributedOptimizer) {
  expect_same_as_single_rank({.world = 4, .pp = 2, .ep = 2, .dist_opt = true, .dispatcher = "alltoall"});
}
// Recomputation re-runs the dispatch (and its collectives) in backward, on every rank alike.
// Interleaved 1F1B: 4 layers over 2 stages of 2 virtual stages, each chunk one MoE layer.
TEST(MoEEquivalence, EP2xPP2Interleaved) {
  expect_same_as_single_rank({.world = 4, .pp = 2, .ep = 2, .dispatcher = "alltoall", .layers = 4, .vpp = 2});
}

TEST(MoEEquivalence, EP2AllToAllRecomputeMoE) {
  expect_same_as_single_rank({.world = 2, .ep = 2, .dispatcher = "alltoall", .recompute = "moe"});
}
TEST(MoEEquivalence, EP2xTP2SequenceParallelFullRecompute) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .recompute = "full"});
}

// The second shape: the expert bias moves with the step's token counts summed over every rank
// that routed them (allgather: each gathered group counted once), the gated shared expert is
// dense (TP-split, its gate's gradient summed over the sequence shards).
TEST(MoEEquivalence, SharedExpertBiasZLossEP2) { expect_same_as_single_rank({.world = 2, .ep = 2, .rich = true}); }
TEST(MoEEquivalence, SharedExpertBiasZLossEP2AllToAll) {
  expect_same_as_single_rank({.world = 2, .ep = 2, .dispatcher = "alltoall", .rich = true});
}
TEST(MoEEquivalence, SharedExpertBiasZLossEP2xTP2SequenceParallel) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .rich = true});
}
TEST(MoEEquivalence, SharedExpertBiasZLossEP2xTP2SequenceParallelAllToAll) {
  expect_same_as_single_rank(
      {.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .dispatcher = "alltoall", .rich = true});
}
// --moe-shared-expert-overlap: the shared expert (TP-split, with its own collectives) runs while
// the EP token exchange is in flight, forward and backward; the single-rank run has no overlap.
TEST(MoEEquivalence, SharedExpertOverlapEP2AllToAll) {
  expect_same_as_single_rank({.world = 2, .ep = 2, .dispatcher = "alltoall", .rich = true, .shared_overlap = true});
}
TEST(MoEEquivalence, SharedExpertOverlapEP2xTP2SequenceParallelAllToAll) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .ep = 2, .etp = 2, .sp = true, .dispatcher = "alltoall",
                              .rich = true, .shared_overlap = true});
}

}  // namespace
}  // namespace mt
