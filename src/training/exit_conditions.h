#pragma once
// Stopping a run cleanly before its end (Megatron's --exit-signal-handler and
// --exit-duration-in-mins): a signal (SLURM's SIGTERM before preemption, or --exit-signal) or the
// time limit asks for a stop; at the end of the iteration every rank agrees (one small
// all-reduce, so no rank saves alone), the trainer saves a checkpoint and the run exits 0.
// A second signal while saving only sets the flag again: saves are atomic anyway (temporary
// directory, fsync, rename, tracker last), so even a kill cannot corrupt the previous one.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "training/arguments_ops.h"

namespace mt {

class ExitConditions {
 public:
  // Installs the signal handler (--exit-signal-handler); `world`: every rank.
  ExitConditions(const OpsArgs& a, comm::CommPtr world);
  ~ExitConditions();  // restores the signal's previous handler
  ExitConditions(const ExitConditions&) = delete;
  ExitConditions& operator=(const ExitConditions&) = delete;

  bool enabled() const { return handler_ || minutes_ > 0; }
  // Called by every rank after each iteration (`iterations`: run so far by this process). Why
  // the run stops now, the same answer on every rank; nullopt: go on.
  std::optional<std::string> check(int64_t iterations);

 private:
  double elapsed_minutes(int64_t iterations) const;

  comm::CommPtr world_;
  int signal_ = SIGTERM;
  std::string signal_name_;
  bool handler_ = false;
  int64_t minutes_ = 0;
  double test_minutes_per_iteration_ = 0;  // MT_TEST_MINUTES_PER_ITERATION (tests): fake elapsed time
  std::chrono::steady_clock::time_point start_;
  struct sigaction previous_ {};
};

}  // namespace mt
