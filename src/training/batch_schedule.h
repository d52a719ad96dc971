#pragma once
// The global batch size as training goes on: constant (--global-batch-size), Megatron's linear
// ramp-up (--rampup-batch-size START INCREMENT SAMPLES: from START, INCREMENT more every
// SAMPLES / ((GBS - START) / INCREMENT) consumed samples, GBS after SAMPLES), or Megatron 0.20's
// step schedule (--step-batch-size-schedule "THRESHOLD:BS ...", thresholds in tokens with K/M/B/T
// suffixes, converted to samples by --seq-length). Every batch size must be a multiple of
// micro-batch x data-parallel size, checked up front.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt {

struct Arguments;

class BatchSchedule {
 public:
  BatchSchedule() = default;
  // From the arguments (validated: validate_batch_schedule_args).
  explicit BatchSchedule(const Arguments& a);
  int64_t at(int64_t consumed_samples) const;
  bool constant() const { return steps_.size() <= 1 && rampup_increment_ == 0; }
  // Iterations that consume `samples` (--train-samples) under this schedule.
  int64_t iterations_for(int64_t samples) const;

 private:
  int64_t final_ = 0;
  int64_t rampup_start_ = 0, rampup_increment_ = 0;
  double rampup_samples_per_increment_ = 0;
  int64_t rampup_samples_ = 0;
  std::vector<std::pair<int64_t, int64_t>> steps_;  // (from consumed samples, batch size), ascending
};

// Parses "THRESHOLD:BS ..." (spaces or commas between entries) into (samples, batch size).
std::vector<std::pair<int64_t, int64_t>> parse_step_schedule(const std::string& s, int64_t seq_length);

// Checks the schedule flags against the batch and parallel sizes, and sets --global-batch-size
// from a step schedule's last entry when it was not given. Runs before the batch checks.
void validate_batch_schedule_args(Arguments& a);

}  // namespace mt
