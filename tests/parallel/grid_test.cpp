// Rank-grid arithmetic (DESIGN.md: tp-cp-ep-dp-pp, leftmost fastest) and the validation rules
// for parallel sizes, as errors naming the flags.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/gpt_model.h"
#include "parallel/grid.h"
#include "training/arguments.h"

namespace mt::parallel {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RankGrid, RankFormulaAndGroups) {
  RankGrid g(16, /*tp=*/2, /*pp=*/2, /*cp=*/2);
  EXPECT_EQ(g.dp(), 2);
  // rank = tp + TP*(cp + CP*(dp + DP*pp))
  for (int r = 0; r < 16; ++r) {
    Coord c = g.coord(r);
    EXPECT_EQ(r, c.tp() + 2 * (c.cp() + 2 * (c.dp() + 2 * c.pp())));
    EXPECT_EQ(g.rank(c), r);
  }
  EXPECT_EQ(g.group(5, "tp"), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.group(5, "cp"), (std::vector<int>{5, 7}));
  EXPECT_EQ(g.group(5, "dp"), (std::vector<int>{1, 5}));
  EXPECT_EQ(g.group(5, "pp"), (std::vector<int>{5, 13}));
  EXPECT_EQ(g.group(5, "dp-cp"), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(g.group(5, "tp-pp"), (std::vector<int>{4, 5, 12, 13}));
  EXPECT_EQ(g.group(5, "pp-tp"), g.group(5, "tp-pp"));  // order of names does not matter
  EXPECT_EQ(g.embedding_group(5), (std::vector<int>{5, 13}));
  auto tps = g.all_groups("tp");
  ASSERT_EQ(tps.size(), 8u);
  EXPECT_EQ(tps[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(tps[7], (std::vector<int>{14, 15}));
  EXPECT_EQ(g.all_groups("dp").size(), 8u);
}

TEST(RankGrid, TpDpLayoutOfFourRanks) {
  RankGrid g(4, 2, 1);
  EXPECT_EQ(g.dp(), 2);
  EXPECT_EQ(g.all_groups("tp"), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.all_groups("dp"), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(g.group(3, "tp-pp"), (std::vector<int>{2, 3}));
}

TEST(RankGrid, WorldNotDivisibleNamesTheFlags) {
  auto m = error_of([] { RankGrid(6, 4, 1); });
  EXPECT_NE(m.find("--tensor-model-parallel-size (4)"), std::string::npos) << m;
  EXPECT_NE(error_of([] { RankGrid(8, 2, 1, 1, 3); }).find("--expert-model-parallel-size"), std::string::npos);
  EXPECT_NE(error_of([] { RankGrid(8, 0, 1); }).find("at least 1"), std::string::npos);
}

// Megatron's MoE parallel folding: the expert RankGenerator (tp=ETP, ep=EP, dp=EDP, cp=1, same
// order) lays the ranks of each pipeline stage out as etp + ETP*(ep + EP*edp).
TEST(RankGrid, ExpertGridFoldsTheDenseRanks) {
  RankGrid g(8, /*tp=*/2, /*pp=*/1, /*cp=*/1, /*ep=*/2, /*etp=*/1);
  EXPECT_EQ(g.dp(), 4);  // EP does not divide the dense data-parallel size
  EXPECT_EQ(g.expert_data_parallel(), 4);
  const RankGrid e = g.expert_grid();
  EXPECT_EQ(e.all_groups("ep"), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(e.all_groups("edp"), (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(e.all_groups("etp").size(), 8u);  // ETP 1: groups of one
  EXPECT_EQ(e.group(5, "etp-ep"), (std::vector<int>{4, 5}));
  // Dense groups are unchanged by EP.
  EXPECT_EQ(g.all_groups("tp"), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.group(5, "dp"), (std::vector<int>{1, 3, 5, 7}));

  RankGrid h(8, 2, 1, 1, 2);  // ETP defaults to TP, as Megatron's
  EXPECT_EQ(h.expert_tensor_parallel(), 2);
  const RankGrid f = h.expert_grid();
  EXPECT_EQ(f.all_groups("etp"), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(f.all_groups("ep"), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(f.all_groups("edp"), (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(f.all_groups("etp-ep"), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));

  // With pipeline stages the expert grid folds each stage's ranks; PP groups are the dense ones.
  RankGrid p(8, 1, 2, 1, 2);
  const RankGrid q = p.expert_grid();
  EXPECT_EQ(q.all_groups("ep"), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(q.all_groups("edp"), (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(q.all_groups("pp"), p.all_groups("pp"));
  EXPECT_EQ(q.group(3, "etp-ep-pp"), (std::vector<int>{2, 3, 6, 7}));
}

TEST(RankGrid, ExpertSizesThatDoNotFoldNameTheFlags) {
  auto m = error_of([] { RankGrid(4, 1, 1, 1, 8); });
  EXPECT_NE(m.find("--expert-model-parallel-size (8)"), std::string::npos) << m;
  m = error_of([] { RankGrid(4, 2, 1, 1, 4, 2); });  // ETP 2 x EP 4 over 4 ranks
  EXPECT_NE(m.find("--expert-tensor-parallel-size (2)"), std::string::npos) << m;
  EXPECT_NE(error_of([] { RankGrid(4, 2, 1, 1, 1, -1); }).find("--expert-tensor-parallel-size"), std::string::npos);
}

Arguments args_for(int64_t world, int64_t tp) {
  Arguments a;
  a.world_size = world;
  a.tensor_model_parallel_size = tp;
  a.data.mock = true;
  a.train_iters = 1;
  a.model.num_layers = 2;
  a.model.hidden_size = 32;
  a.model.num_attention_heads = 4;
  a.model.seq_length = 16;
  a.make_vocab_size_divisible_by = 8;
  return a;
}

TEST(ParallelArgs, Validation) {
  auto a = args_for(6, 4);
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("world size 6 is not divisible"), std::string::npos);
  a = args_for(8, 2);
  a.micro_batch_size = 2;
  a.global_batch_size = 4;
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("data-parallel size (4)"), std::string::npos);
  a = args_for(8, 8);  // 4 heads over 8 TP ranks
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--num-attention-heads (4)"), std::string::npos);
  a = args_for(4, 4);  // TP 4 > 3 query groups, not a multiple of them (TP 4 with 2 groups replicates K/V)
  a.model.hidden_size = 48;
  a.model.num_attention_heads = 12;
  a.group_query_attention = true;
  a.model.num_query_groups = 3;
  a.given = {"--num-query-groups"};
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--num-query-groups (3)"), std::string::npos);
  a = args_for(2, 2);
  a.sequence_parallel = true;
  a.model.seq_length = 15;
  a.model.max_position_embeddings = 16;
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--sequence-parallel"), std::string::npos);
  a = args_for(2, 1);
  a.overlap_param_gather = true;
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--use-distributed-optimizer"), std::string::npos);
  a = args_for(2, 2);
  a.tp_comm_overlap = true;  // overlaps the sequence-parallel collectives: needs them
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--tp-comm-overlap"), std::string::npos);
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--sequence-parallel"), std::string::npos);
  a = args_for(4, 1);
  a.pipeline_model_parallel_size = 4;  // 2 layers over 4 stages
  EXPECT_NE(error_of([&] { validate_args(a, 50); }).find("--pipeline-model-parallel-size (4)"), std::string::npos);
  a = args_for(4, 2);
  a.sequence_parallel = true;
  validate_args(a, 50);
  EXPECT_EQ(a.data_parallel_size, 2);
  EXPECT_EQ(a.model.vocab_size, 64);  // padded to a multiple of 8 x TP
  a = args_for(2, 1);
  a.sequence_parallel = true;  // no TP: Megatron switches it off
  validate_args(a, 50);
  EXPECT_FALSE(a.sequence_parallel);
}

TEST(ParallelArgs, FlagsParse) {
  Arguments a = parse_pretrain_args({"--overlap-grad-reduce", "--ddp-bucket-size", "1000",
                                     "--distributed-timeout-minutes", "3", "--use-distributed-optimizer",
                                     "--overlap-param-gather", "--tensor-model-parallel-size", "2",
                                     "--sequence-parallel", "--tp-comm-overlap"});
  EXPECT_TRUE(a.overlap_grad_reduce);
  EXPECT_TRUE(a.tp_comm_overlap);
  EXPECT_TRUE(a.overlap_param_gather);
  EXPECT_EQ(a.ddp_bucket_size, 1000);
  EXPECT_EQ(a.distributed_timeout_minutes, 3);
}

}  // namespace
}  // namespace mt::parallel
