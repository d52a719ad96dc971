// What `megatron launch` adds to its ranks' environment: OMP_WAIT_POLICY=PASSIVE exactly when the
// node's ranks would run more OpenMP threads than it has cores and the user set no policy.
#include "training/launch_env.h"

#include <gtest/gtest.h>

namespace mt::training {
namespace {

TEST(LaunchEnv, PassiveWaitOnlyWhenRanksShareCores) {
  // 4 ranks x 2 threads on 2 cores (CI's parallel tests): oversubscribed.
  EXPECT_EQ(rank_omp_wait_policy(4, "2", nullptr, 2), "PASSIVE");
  // Without OMP_NUM_THREADS each rank's OpenMP takes every core: two ranks already share them.
  EXPECT_EQ(rank_omp_wait_policy(2, nullptr, nullptr, 16), "PASSIVE");
  EXPECT_EQ(rank_omp_wait_policy(2, "", nullptr, 16), "PASSIVE");
  // Enough cores for every thread (8 ranks x 2 threads on 16, a GPU node's one thread per rank):
  // left alone.
  EXPECT_EQ(rank_omp_wait_policy(8, "2", nullptr, 16), std::nullopt);
  EXPECT_EQ(rank_omp_wait_policy(8, "1", nullptr, 8), std::nullopt);
  EXPECT_EQ(rank_omp_wait_policy(1, nullptr, nullptr, 2), std::nullopt);
  // A nested list counts its first level; an unreadable count is taken as unset.
  EXPECT_EQ(rank_omp_wait_policy(2, "4,2", nullptr, 8), std::nullopt);
  EXPECT_EQ(rank_omp_wait_policy(2, "8,2", nullptr, 8), "PASSIVE");
  EXPECT_EQ(rank_omp_wait_policy(2, "many", nullptr, 8), "PASSIVE");
  // The user's policy stands, whatever it is.
  EXPECT_EQ(rank_omp_wait_policy(4, "2", "ACTIVE", 2), std::nullopt);
  EXPECT_EQ(rank_omp_wait_policy(4, "2", "PASSIVE", 2), std::nullopt);
  // No core count known: left alone.
  EXPECT_EQ(rank_omp_wait_policy(4, "2", nullptr, 0), std::nullopt);
}

}  // namespace
}  // namespace mt::training
