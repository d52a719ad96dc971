#include "training/exit_conditions.h"

#include <cstdlib>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mt {
namespace {
// Written by the handler only (async-signal-safe), read by the loop between iterations.
volatile std::sig_atomic_t g_signal_received = 0;
extern "C" void on_exit_signal(int) { g_signal_received = 1; }
}  // namespace

ExitConditions::ExitConditions(const OpsArgs& a, comm::CommPtr world)
    : world_(std::move(world)), minutes_(a.exit_duration_in_mins), start_(std::chrono::steady_clock::now()) {
  if (const char* t = std::getenv("MT_TEST_MINUTES_PER_ITERATION")) test_minutes_per_iteration_ = std::atof(t);
  if (!a.exit_signal_handler) return;
  signal_ = exit_signal_number(a.exit_signal);
  signal_name_ = a.exit_signal.rfind("SIG", 0) == 0 ? a.exit_signal : "SIG" + a.exit_signal;
  g_signal_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // collectives and file writes in flight go on rather than fail with EINTR
  if (::sigaction(signal_, &sa, &previous_) != 0)
    fail("--exit-signal-handler: cannot install a handler for {} ({})", a.exit_signal, std::strerror(errno));
  handler_ = true;
}

ExitConditions::~ExitConditions() {
  if (handler_) ::sigaction(signal_, &previous_, nullptr);
}

double ExitConditions::elapsed_minutes(int64_t iterations) const {
  const double real = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count() / 60.0;
  return real + test_minutes_per_iteration_ * static_cast<double>(iterations);
}

std::optional<std::string> ExitConditions::check(int64_t iterations) {
  if (!enabled()) return std::nullopt;
  // Each rank's own view (a signal may reach some ranks only, clocks drift), then the maximum
  // over all ranks: 1 = time is up, 2 = a signal came.
  int64_t why = 0;
  const double minutes = minutes_ > 0 ? elapsed_minutes(iterations) : 0.0;
  if (minutes_ > 0 && minutes > static_cast<double>(minutes_)) why = 1;
  if (handler_ && g_signal_received) why = 2;
  if (world_ && world_->size() > 1) why = world_->all_reduce_value(why, comm::ReduceOp::Max);
  if (why == 2) return fmt::format("received {} (--exit-signal-handler)", signal_name_);
  if (why == 1) return fmt::format("the run has trained {:.1f} minutes (--exit-duration-in-mins {})", minutes, minutes_);
  return std::nullopt;
}

}  // namespace mt
