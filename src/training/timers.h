#pragma once
// Megatron's timers (--timing-log-level, --timing-log-option): named phases of the step timed on
// the host clock (on the GPU each start and stop waits for the device, as Megatron's do, so
// level 1-2 cost some speed), summed over a log interval, then gathered over every rank and
// printed after the log line with Megatron's names and layout:
//   (min, max) time across ranks (ms):
//       forward-backward ...............................: (12.34, 12.56)
// Level 1: once-per-iteration phases; level 2 adds the per-micro-batch ones (the pipeline's
// compute and p2p, parallel/phase_timer.h) and batch-generator.
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/phase_timer.h"

namespace mt {

class Timers : public parallel::PhaseTimer {
 public:
  // `level`: --timing-log-level (0: every timer is off); `option`: max | minmax | all;
  // `world`: every rank (report() gathers over it); `gpu`: synchronise the device at each mark.
  Timers(int level, std::string option, comm::CommPtr world, bool gpu);

  // Whether a timer of this level runs.
  bool on(int level) const { return level <= level_ && level_ > 0; }
  void start(const char* name) override;
  void stop(const char* name) override;

  struct Report {
    std::string text;                                      // Megatron's block; empty: nothing timed
    std::vector<std::pair<std::string, double>> max_seconds;  // per iteration, max over ranks
  };
  // Every rank calls it at the same iterations (a collective). Times per iteration over
  // `iterations`; resets the totals.
  Report report(int64_t iterations);

  // Megatron's names in its print order, and the level each is on.
  static const std::vector<std::pair<const char*, int>>& names();

 private:
  int index(const char* name) const;
  int level_;
  std::string option_;
  comm::CommPtr world_;
  bool gpu_;
  std::vector<double> total_;  // seconds, per name
  std::vector<std::chrono::steady_clock::time_point> started_;
  std::vector<bool> running_;
};

// A scope timed by `t` when its level is on.
class TimerScope {
 public:
  TimerScope(Timers* t, const char* name, int level) : t_(t && t->on(level) ? t : nullptr), name_(name) {
    if (t_) t_->start(name_);
  }
  ~TimerScope() {
    if (t_) t_->stop(name_);
  }
  TimerScope(const TimerScope&) = delete;
  TimerScope& operator=(const TimerScope&) = delete;

 private:
  Timers* t_;
  const char* name_;
};

}  // namespace mt
