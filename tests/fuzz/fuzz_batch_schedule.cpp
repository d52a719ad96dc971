// libFuzzer target: --step-batch-size-schedule's parser (THRESHOLD:BS entries with K/M/B/T
// suffixes) and the schedule built from it.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "training/arguments.h"
#include "training/batch_schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    mt::Arguments a;
    a.micro_batch_size = 1;
    a.data_parallel_size = 1;
    a.model.seq_length = 1 + static_cast<int64_t>(size % 4096);
    a.step_batch_size_schedule = text;
    mt::validate_batch_schedule_args(a);
    // A run derives the global batch (validate_training_args) before it builds the schedule.
    if (a.global_batch_size <= 0) a.global_batch_size = 1 + static_cast<int64_t>(size % 64);
    const mt::BatchSchedule s(a);
    for (int64_t c : {int64_t{0}, int64_t{1}, int64_t{1} << 20, int64_t{1} << 40}) (void)s.at(c);
    (void)s.iterations_for(int64_t{1} << 16);
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
