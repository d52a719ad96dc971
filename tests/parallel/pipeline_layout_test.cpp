// How layers are split over pipeline ranks and virtual stages, and Megatron's rules as errors.
#include "parallel/pipeline_layout.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "training/arguments.h"

namespace mt::parallel {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

TEST(PipelineLayout, EvenSplit) {
  PipelineLayout l(8, {.pp = 4});
  EXPECT_EQ(l.vpp(), 1);
  EXPECT_EQ(l.chunks(0), (Ranges{{0, 2}}));
  EXPECT_EQ(l.chunks(3), (Ranges{{6, 8}}));
}

TEST(PipelineLayout, VirtualStagesInterleaveOverRanks) {
  // Virtual stage v = chunk * PP + rank takes the v-th slice.
  PipelineLayout a(8, {.pp = 2, .num_layers_per_virtual_stage = 2});
  EXPECT_EQ(a.vpp(), 2);
  EXPECT_EQ(a.chunks(0), (Ranges{{0, 2}, {4, 6}}));
  EXPECT_EQ(a.chunks(1), (Ranges{{2, 4}, {6, 8}}));
  PipelineLayout b(8, {.pp = 2, .virtual_stages_per_rank = 4});
  EXPECT_EQ(b.chunks(1), (Ranges{{1, 2}, {3, 4}, {5, 6}, {7, 8}}));
}

TEST(PipelineLayout, UnevenFirstAndLast) {
  PipelineLayout a(10, {.pp = 3, .first_stage_layers = 2, .last_stage_layers = 4});
  EXPECT_EQ(a.chunks(0), (Ranges{{0, 2}}));
  EXPECT_EQ(a.chunks(1), (Ranges{{2, 6}}));
  EXPECT_EQ(a.chunks(2), (Ranges{{6, 10}}));
  PipelineLayout b(5, {.pp = 2, .first_stage_layers = 1});  // the rest on the last stage
  EXPECT_EQ(b.chunks(1), (Ranges{{1, 5}}));
  // With virtual stages: the first rank's chunks have 2 layers, the last rank's 4.
  PipelineLayout c(12, {.pp = 2, .virtual_stages_per_rank = 2, .first_stage_layers = 4});
  EXPECT_EQ(c.chunks(0), (Ranges{{0, 2}, {6, 8}}));
  EXPECT_EQ(c.chunks(1), (Ranges{{2, 6}, {8, 12}}));
}

void expect_error(int64_t layers, const PipelineOptions& o, const std::string& names) {
  try {
    PipelineLayout l(layers, o);
    ADD_FAILURE() << "no error; expected one naming " << names;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(PipelineLayout, MegatronRulesAreErrors) {
  expect_error(10, {.pp = 4}, "--pipeline-model-parallel-size");
  expect_error(8, {.pp = 2, .num_layers_per_virtual_stage = 3}, "--num-layers-per-virtual-pipeline-stage");
  expect_error(8, {.pp = 2, .num_layers_per_virtual_stage = 2, .virtual_stages_per_rank = 2}, "only one");
  expect_error(8, {.pp = 1, .virtual_stages_per_rank = 2}, "--pipeline-model-parallel-size > 1");
  expect_error(8, {.pp = 2, .num_layers_per_virtual_stage = 1, .first_stage_layers = 2},
               "--num-virtual-stages-per-pipeline-rank");
  expect_error(8, {.pp = 2, .virtual_stages_per_rank = 2, .first_stage_layers = 3},
               "--decoder-first-pipeline-num-layers");
  expect_error(9, {.pp = 4, .first_stage_layers = 2, .last_stage_layers = 2}, "split evenly");
  expect_error(4, {.pp = 2, .first_stage_layers = 1, .last_stage_layers = 2}, "split evenly");
  expect_error(4, {.pp = 3, .first_stage_layers = 2, .last_stage_layers = 2}, "at least one layer");
  expect_error(4, {.pp = 1, .first_stage_layers = 2}, "--pipeline-model-parallel-size > 1");
  expect_error(2, {.pp = 4}, "--pipeline-model-parallel-size");
}

// The flags, and validate_args applying the split and the interleaved micro-batch rules.
TEST(PipelineArgs, FlagsAndValidation) {
  Arguments a = parse_pretrain_args({"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                     "2", "--decoder-first-pipeline-num-layers", "2",
                                     "--microbatch-group-size-per-virtual-pipeline-stage", "3",
                                     "--no-overlap-p2p-communication"});
  EXPECT_EQ(a.pipeline_model_parallel_size, 2);
  EXPECT_EQ(a.num_virtual_stages_per_pipeline_rank, 2);
  EXPECT_EQ(a.decoder_first_pipeline_num_layers, 2);
  EXPECT_EQ(a.microbatch_group_size_per_vp_stage, 3);

  auto base = [] {
    Arguments b;
    b.world_size = 2;
    b.pipeline_model_parallel_size = 2;
    b.data.mock = true;
    b.train_iters = 1;
    b.model.num_layers = 4;
    b.model.hidden_size = 32;
    b.model.num_attention_heads = 4;
    b.model.seq_length = 16;
    b.micro_batch_size = 2;
    b.global_batch_size = 8;
    return b;
  };
  auto error_of = [](Arguments b) {
    try {
      validate_args(b, 50);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Arguments b = base();
  b.num_layers_per_virtual_pipeline_stage = 1;
  validate_args(b, 50);
  EXPECT_EQ(b.virtual_pipeline_model_parallel_size, 2);
  b = base();
  b.num_virtual_stages_per_pipeline_rank = 2;
  b.global_batch_size = 6;  // 3 micro-batches: 3 % 2 leaves 1 < PP
  EXPECT_NE(error_of(b).find("--microbatch-group-size-per-virtual-pipeline-stage"), std::string::npos) << error_of(b);
  b.microbatch_group_size_per_vp_stage = 3;  // one group of 3 is fine
  EXPECT_EQ(error_of(b), "");
  b = base();
  b.global_batch_size = 2;  // 1 micro-batch: fine for 1F1B...
  EXPECT_EQ(error_of(b), "");
  b.num_virtual_stages_per_pipeline_rank = 2;  // ...but not for the interleaved schedule
  EXPECT_NE(error_of(b).find("at least --pipeline-model-parallel-size"), std::string::npos) << error_of(b);
  b = base();
  b.decoder_first_pipeline_num_layers = 0;
  b.given = {"--decoder-first-pipeline-num-layers"};
  EXPECT_NE(error_of(b).find("must be positive"), std::string::npos);
  b = base();
  b.model.num_layers = 3;
  EXPECT_NE(error_of(b).find("--decoder-first-pipeline-num-layers"), std::string::npos) << error_of(b);
}

}  // namespace
}  // namespace mt::parallel
