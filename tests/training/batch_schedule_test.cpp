// Batch-size schedules: Megatron's ramp-up formula and its 0.20 step schedule.
#include <gtest/gtest.h>

#include "core/error.h"
#include "training/arguments.h"
#include "training/batch_schedule.h"

namespace mt {
namespace {

Arguments base() {
  Arguments a;
  a.micro_batch_size = 8;
  a.data_parallel_size = 1;
  a.model.seq_length = 4096;
  return a;
}

TEST(BatchSchedule, RampupFollowsMegatronsFormula) {
  // Megatron's own example: 16 to 1024 by 8 over 300000 samples: 126 increments of ~2381 samples.
  Arguments a = base();
  a.global_batch_size = 1024;
  a.rampup_batch_size = {"16", "8", "300000"};
  validate_batch_schedule_args(a);
  const BatchSchedule s(a);
  EXPECT_FALSE(s.constant());
  EXPECT_EQ(s.at(0), 16);
  EXPECT_EQ(s.at(2380), 16);  // 300000 / 126 = 2380.95
  EXPECT_EQ(s.at(2381), 24);
  EXPECT_EQ(s.at(299999), 16 + 125 * 8);
  EXPECT_EQ(s.at(300001), 1024);
  // --train-samples: the ramp's small steps, then full batches.
  int64_t consumed = 0, iters = 0;
  while (consumed < 1000000) consumed += s.at(consumed), ++iters;
  EXPECT_NEAR(static_cast<double>(s.iterations_for(1000000)), static_cast<double>(iters), 1.0);
}

TEST(BatchSchedule, StepScheduleInTokens) {
  Arguments a = base();
  a.step_batch_size_schedule = "0:16 2.4B:320 4.8B:624";
  validate_batch_schedule_args(a);
  EXPECT_EQ(a.global_batch_size, 624);  // from the last entry
  const BatchSchedule s(a);
  const int64_t t1 = 2400000000LL / 4096, t2 = 4800000000LL / 4096;
  EXPECT_EQ(s.at(0), 16);
  EXPECT_EQ(s.at(t1 - 1), 16);
  EXPECT_EQ(s.at(t1), 320);
  EXPECT_EQ(s.at(t2), 624);
}

TEST(BatchSchedule, MistakesAreNamed) {
  auto message = [](Arguments a) -> std::string {
    try {
      validate_batch_schedule_args(a);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  Arguments a = base();
  a.global_batch_size = 64;
  a.rampup_batch_size = {"16", "10", "100"};
  EXPECT_NE(message(a).find("not a multiple of the increment 10"), std::string::npos) << message(a);
  a.rampup_batch_size = {"4", "4", "100"};  // 4 is below one micro-batch of 8
  EXPECT_NE(message(a).find("batch size 4 is not a multiple of --micro-batch-size (8)"), std::string::npos)
      << message(a);
  a.rampup_batch_size = {"16", "8"};
  EXPECT_NE(message(a).find("takes three values"), std::string::npos);
  Arguments b = base();
  b.global_batch_size = 32;
  b.step_batch_size_schedule = "0:16 1M:64";
  EXPECT_NE(message(b).find("disagrees"), std::string::npos) << message(b);
  b.step_batch_size_schedule = "100K:16";  // 100000 tokens: sample 24
  b.global_batch_size = 0;
  EXPECT_NE(message(b).find("must start at 0"), std::string::npos) << message(b);
  b.step_batch_size_schedule = "0:16 1X:32";
  EXPECT_NE(message(b).find("is not a count"), std::string::npos) << message(b);
}

}  // namespace
}  // namespace mt
