// Pretrain's logging section: the log line and evaluation.
#include <cstdint>

#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_logging_flags(FlagParser& p, LoggingArgs& a) {
  p.value("--log-interval", &a.log_interval, "iterations between log lines (default 100)", {1, INT64_MAX});
  p.value("--timing-log-level", &a.timing_log_level,
          "Megatron's timers each log interval: 0 none (default), 1 once-per-iteration phases (forward-backward, "
          "grad sync, optimizer), 2 also per-micro-batch ones (forward-compute, pipeline send/recv)");
  p.value("--eval-interval", &a.eval_interval, "iterations between evaluations (default 1000)", {1, INT64_MAX});
  p.value("--eval-iters", &a.eval_iters, "iterations per evaluation (default 100; 0 disables)", {0, kMaxSteps});
  p.store_true("--eval-at-start", &a.eval_at_start, "megatron.cpp: also evaluate before the first iteration");
  p.custom("--no-progress-bar", false, [&a](const std::string&) { a.log_progress_bar = false; },
           "no progress bar even on a terminal");
}

void validate_logging_args(const LoggingArgs& a) {
  if (a.log_interval <= 0) fail("--log-interval must be positive (got {})", a.log_interval);
  if (a.timing_log_level < 0 || a.timing_log_level > 2)
    fail("--timing-log-level must be 0, 1 or 2 (got {})", a.timing_log_level);
  if (a.eval_interval <= 0) fail("--eval-interval must be positive (got {})", a.eval_interval);
  if (a.eval_iters < 0) fail("--eval-iters must be >= 0 (got {})", a.eval_iters);
}

}  // namespace mt
