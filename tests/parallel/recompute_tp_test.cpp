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

model::TransformerConfig config(const std::string& granularity, const std::string& method, int64_t n) {
  return testing::recompute_tp_config(4, false, granularity, method, n);
}

TEST(RecomputeTP, TP2SequenceParallelIsBitIdentical) {
  testing::RankOptions opt;
  opt.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = testing::run_ranks(
      2,
      [](comm::World& w) {
        parallel::RankGrid grid(w.size(), 2, 1);
        auto pg = parallel::build_process_groups(w, grid);
        const auto want = testing::two_microbatch_grads(config("", "", 0), pg.tp.get());
        for (const auto& c : {config("full", "uniform", 2), config("full", "block", 1),
                              config("selective", "", 0)}) {
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
