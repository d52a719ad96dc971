// Context parallelism trains the same model to the same losses and gradients as one rank at
// full sequence length (fp32): CP 2 and 4 with each --cp-comm-type, CP with TP (+SP), PP
// (also interleaved), DP with the distributed optimizer, and packed documents (with and
// without CP). Ranks are forked processes over Gloo, as in equivalence_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/multiprocess.h"
#include "data/tokenizers/null_tokenizer.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"
#include "training/trainer.h"

namespace mt {
namespace {

constexpr int kSteps = 8;
constexpr int32_t kVocab = 64;
constexpr int32_t kEod = 60;  // the NullTokenizer of 60 ids: EOD is 60, inside the padded vocabulary

enum class Shape { Llama, Gpt };

struct Layout {
  Shape shape = Shape::Llama;
  int world = 1, tp = 1, pp = 1, vpp = 0, cp = 1;
  const char* comm = "p2p";
  int a2a = 0;  // a2a+p2p: the all-to-all size
  bool sp = false, dist_opt = false, packed = false;
  int layers = 2;
  int64_t mbs = 4;
  const char* recompute = "";  // --recompute-granularity (full: uniform, one layer per group)
};

// PatternSource's sequences with an end-of-document token every few positions (a different
// phase per sample), so samples pack several documents.
class DocSource : public data::SampleSource {
 public:
  DocSource(int64_t S) : inner_(100000, S, kVocab), S_(S) {}
  int64_t size() const override { return inner_.size(); }
  int64_t seq_length() const override { return S_; }
  void get(int64_t index, int32_t* t) const override {
    inner_.get(index, t);
    for (int64_t i = 0; i <= S_; ++i)
      if ((i + index) % 6 == 2 || (i * 5 + index) % 11 == 0) t[i] = kEod;
  }

 private:
  testing::PatternSource inner_;
  int64_t S_;
};

Arguments make_args(const Layout& l) {
  Arguments a;
  testing::set_layout_model(a, l.layers);
  if (l.shape == Shape::Llama) {
    testing::set_query_groups(a, 4);
    test::use_llama_blocks(a.model);
  } else {
    a.model.position_embedding_type = "learned_absolute";
  }
  testing::set_short_run(a, kSteps, l.mbs, 3e-3f, 3e-4);
  a.world_size = l.world;
  a.tensor_model_parallel_size = l.tp;
  a.pipeline_model_parallel_size = l.pp;
  a.num_virtual_stages_per_pipeline_rank = l.vpp;
  a.context_parallel_size = l.cp;
  a.cp_comm_type = l.comm;
  if (l.a2a) a.hierarchical_cp_sizes = {std::to_string(l.a2a), std::to_string(l.cp / l.a2a)};
  a.sequence_parallel = l.sp;
  a.use_distributed_optimizer = l.dist_opt;
  a.reset_position_ids = a.reset_attention_mask = a.eod_mask_loss = l.packed;
  a.model.recompute_granularity = l.recompute;
  if (std::string(l.recompute) == "full") {
    a.model.recompute_method = "uniform";
    a.model.recompute_num_layers = 1;
    a.given = {"--num-query-groups", "--recompute-method", "--recompute-num-layers"};
  }
  validate_args(a, kVocab);
  return a;
}

const std::string& tmp_dir() { return testing::scratch_dir("mt_cp_equiv"); }

void train_rank(comm::World& w, const Layout& l, const std::string& out, const std::string& ref) {
  Arguments a = make_args(l);
  parallel::RankGrid grid(w.size(), l.tp, l.pp, l.cp);
  auto pg = w.size() > 1 ? parallel::build_process_groups(w, grid, static_cast<int>(a.cp_a2a_size))
                         : parallel::local_process_groups();
  Trainer t(a, l.packed ? std::make_unique<data::NullTokenizer>(kEod) : nullptr, pg);
  const int64_t S = a.model.seq_length;
  if (l.packed) t.set_data(std::make_unique<DocSource>(S), nullptr);
  else t.set_data(std::make_unique<testing::PatternSource>(100000, S, kVocab), nullptr);
  const std::vector<double> losses = testing::train_checking_step1(t, kSteps, w.rank(), out, ref);
  if (w.rank() == 0) testing::write_losses(out + ".loss", losses);
}

void expect_same_as_single_rank(const Layout& l) {
  auto train = [](const Layout& layout) {
    return [layout](comm::World& w, const std::string& out, const std::string& ref) { train_rank(w, layout, out, ref); };
  };
  const Layout single{.shape = l.shape, .packed = l.packed, .layers = l.layers};
  const std::string name = fmt::format("/ref_{}_{}_{}", l.shape == Shape::Llama ? "llama" : "gpt", l.layers,
                                       l.packed ? "packed" : "plain");
  const std::string& ref = testing::reference_run(tmp_dir() + name, train(single));
  double worst = 0;
  ASSERT_NO_FATAL_FAILURE(testing::expect_layout_matches(ref, tmp_dir() + "/run", l.world, kSteps, train(l), worst));
  std::printf("[ layout ] world %d cp %d (%s) tp %d pp %d%s%s%s: max relative loss difference over %d steps %.2e\n",
              l.world, l.cp, l.comm, l.tp, l.pp, l.sp ? " sp" : "", l.dist_opt ? " dist-opt" : "",
              l.packed ? " packed" : "", kSteps, worst);
}

TEST(ContextParallel, CP2P2P) { expect_same_as_single_rank({.world = 2, .cp = 2}); }
TEST(ContextParallel, CP2AllGather) { expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "allgather"}); }
TEST(ContextParallel, CP2A2A) { expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "a2a"}); }
TEST(ContextParallel, CP2A2AP2PRingOnly) {
  expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "a2a+p2p", .a2a = 1});
}
TEST(ContextParallel, CP2A2AP2PAllToAllOnly) {
  expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "a2a+p2p", .a2a = 2});
}
TEST(ContextParallel, CP4P2P) { expect_same_as_single_rank({.world = 4, .cp = 4}); }
TEST(ContextParallel, CP4AllGather) { expect_same_as_single_rank({.world = 4, .cp = 4, .comm = "allgather"}); }
TEST(ContextParallel, CP4A2A) { expect_same_as_single_rank({.world = 4, .cp = 4, .comm = "a2a"}); }
TEST(ContextParallel, CP4A2AP2P) { expect_same_as_single_rank({.world = 4, .cp = 4, .comm = "a2a+p2p", .a2a = 2}); }
TEST(ContextParallel, CP2Gpt) { expect_same_as_single_rank({.shape = Shape::Gpt, .world = 2, .cp = 2}); }
TEST(ContextParallel, CP2xTP2SequenceParallel) {
  expect_same_as_single_rank({.world = 4, .tp = 2, .cp = 2, .sp = true});
}
TEST(ContextParallel, CP2xTP2A2A) { expect_same_as_single_rank({.world = 4, .tp = 2, .cp = 2, .comm = "a2a"}); }
TEST(ContextParallel, CP2xPP2) { expect_same_as_single_rank({.world = 4, .pp = 2, .cp = 2, .layers = 4}); }
TEST(ContextParallel, CP2xPP2Interleaved) {
  expect_same_as_single_rank({.world = 4, .pp = 2, .vpp = 2, .cp = 2, .layers = 4, .mbs = 2});
}
TEST(ContextParallel, CP2xDP2DistributedOptimizer) {
  expect_same_as_single_rank({.world = 4, .cp = 2, .dist_opt = true, .mbs = 2});
}
// Recomputation re-runs the attention over the CP group in backward (every CP rank does it at
// the same point of its schedule): selective drops the core's output, full a layer's input.
TEST(ContextParallel, CP2SelectiveRecompute) {
  expect_same_as_single_rank({.world = 2, .cp = 2, .recompute = "selective"});
}
TEST(ContextParallel, CP2A2AFullRecomputePacked) {
  expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "a2a", .packed = true, .recompute = "full"});
}
TEST(ContextParallel, PackedDocumentsSingleRankLayoutDP2) { expect_same_as_single_rank({.world = 2, .packed = true}); }
TEST(ContextParallel, PackedDocumentsCP2) { expect_same_as_single_rank({.world = 2, .cp = 2, .packed = true}); }
TEST(ContextParallel, PackedDocumentsCP2AllGather) {
  expect_same_as_single_rank({.world = 2, .cp = 2, .comm = "allgather", .packed = true});
}
TEST(ContextParallel, PackedDocumentsCP4P2P) { expect_same_as_single_rank({.world = 4, .cp = 4, .packed = true}); }
TEST(ContextParallel, PackedDocumentsCP4A2AP2PGpt) {
  expect_same_as_single_rank(
      {.shape = Shape::Gpt, .world = 4, .cp = 4, .comm = "a2a+p2p", .a2a = 2, .packed = true});
}

}  // namespace
}  // namespace mt
