// --distribute-saved-activations (Megatron's CheckpointFunction with distribute_saved_activations):
// under full recomputation each tensor-parallel rank keeps 1/TP of a group's input and the
// re-run all-gathers it first, so gradients stay bit-identical to keeping every activation while
// the group's saved input shrinks by TP. Ranks are forked processes over Gloo.
#include <gtest/gtest.h>

#include <cstring>

#include "comm/multiprocess.h"
#include "model/gpt_model.h"
#include "parallel/layout_support.h"
#include "parallel/process_groups.h"

namespace mt {
namespace {

TEST(DistributeSavedActivations, TP2IsBitIdenticalWithATPthOfTheInput) {
  testing::RankOptions opt;
  opt.env = {{"OMP_NUM_THREADS", "1"}};
  auto res = testing::run_ranks(
      2,
      [](comm::World& w) {
        parallel::RankGrid grid(w.size(), 2, 1);
        auto pg = parallel::build_process_groups(w, grid);
        const auto want = testing::two_microbatch_grads(testing::recompute_tp_config(4, false, "", "", 0),
                                                        pg.tp.get(), false);
        model::TransformerConfig kept = testing::recompute_tp_config(4, false, "full", "uniform", 1);
        model::TransformerConfig split = kept;
        split.distribute_saved_activations = true;
        size_t kept_bytes = 0, split_bytes = 0;
        testing::two_microbatch_grads(kept, pg.tp.get(), false, &kept_bytes);
        const auto got = testing::two_microbatch_grads(split, pg.tp.get(), false, &split_bytes);
        if (got.size() != want.size() || std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0)
          throw Error(fmt::format("rank {}: gradients with distributed saved activations differ", w.rank()));
        if (kept_bytes == 0 || split_bytes * 2 != kept_bytes)
          throw Error(fmt::format("rank {}: the group keeps {} bytes, {} without distributing", w.rank(), split_bytes,
                                  kept_bytes));
      },
      opt);
  ASSERT_EQ(res.size(), 2u);
  for (size_t r = 0; r < res.size(); ++r) EXPECT_EQ(res[r].exit_code, 0) << "rank " << r << ": " << res[r].stderr_text;
}

}  // namespace
}  // namespace mt
