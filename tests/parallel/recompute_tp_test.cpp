// Activation recomputation under tensor and sequence parallelism: the re-run forward repeats
// the layers' TP collectives (all-gathers, reduce-scatters) in the same order on every rank
// and replays both dropout streams (the shared one and the per-TP-rank one), so each rank's
// gradients are bit-identical to keeping every activation. Ranks are forked processes over Gloo.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/multiprocess.h"
#include "model/gpt_model.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"

namespace mt {
namespace {

model::TransformerConfig tp_config(const std::string& granularity, const std::string& method, int64_t n) {
  model::TransformerConfig c;
  c.num_layers = 3;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.ffn_hidden_size = 64;
  c.seq_length = 8;
  c.vocab_size = 64;
  c.orig_vocab_size = 60;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.add_bias_linear = c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.2f;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  return c;
}


TEST(RecomputeTP, TP2SequenceParallelIsBitIdentical) {
  testing::RankOptions opt;
  opt.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = testing::run_ranks(
      2,
      [](comm::World& w) {
        parallel::RankGrid grid(w.size(), 2, 1);
        auto pg = parallel::build_process_groups(w, grid);
        const auto want = testing::two_microbatch_grads(tp_config("", "", 0), pg.tp.get());
        for (const auto& c : {tp_config("full", "uniform", 2), tp_config("full", "block", 1),
                              tp_config("selective", "", 0)}) {
          const auto got = testing::two_microbatch_grads(c, pg.tp.get());
          if (got.size() != want.size() || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0)
            throw Error(fmt::format("rank {}: gradients with {} {} recomputation differ", w.rank(),
                                    c.recompute_granularity, c.recompute_method));
        }
      },
      opt);
  ASSERT_EQ(res.size(), 2u);
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

}  // namespace
}  // namespace mt
