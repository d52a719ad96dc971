// Pretrain's operations section (arguments_ops.h): metrics sinks, timers, stopping, NaN policy,
// stragglers.
#include <csignal>
#include <cstdint>

#include "core/error.h"
#include "training/arguments_sections.h"
#include "training/metrics_server.h"

namespace mt {

int exit_signal_number(const std::string& name) {
  const std::string bare = name.rfind("SIG", 0) == 0 ? name.substr(3) : name;
  if (bare == "TERM") return SIGTERM;
  if (bare == "INT") return SIGINT;
  if (bare == "HUP") return SIGHUP;
  if (bare == "USR1") return SIGUSR1;
  if (bare == "USR2") return SIGUSR2;
  fail("--exit-signal {}: use one of SIGTERM (SLURM's preemption signal, the default), SIGINT, SIGHUP, SIGUSR1, "
       "SIGUSR2",
       name);
}

void register_ops_flags(FlagParser& p, OpsArgs& a) {
  p.value("--tensorboard-dir", &a.tensorboard_dir, "write TensorBoard event files (Megatron's scalar names) here");
  p.value("--tensorboard-log-interval", &a.tensorboard_log_interval,
          "iterations between TensorBoard scalars (default 1)", {1, INT64_MAX});
  p.value("--tensorboard-queue-size", &a.tensorboard_queue_size,
          "TensorBoard events buffered before they are written to disk (default 1000)", {1, int64_t{1} << 20});
  p.store_true("--log-timers-to-tensorboard", &a.log_timers_to_tensorboard,
               "also write iteration-time, throughput and the timers to TensorBoard");
  p.store_true("--log-memory-to-tensorboard", &a.log_memory_to_tensorboard, "also write device memory to TensorBoard");
  p.store_true("--log-validation-ppl-to-tensorboard", &a.log_validation_ppl_to_tensorboard,
               "also write validation perplexity to TensorBoard");
  p.store_true("--log-world-size-to-tensorboard", &a.log_world_size_to_tensorboard,
               "also write the world size to TensorBoard");
  p.store_false("--no-log-loss-scale-to-tensorboard", &a.log_loss_scale_to_tensorboard,
                "do not write loss-scale to TensorBoard");
  p.store_true("--log-params-norm", &a.log_params_norm, "compute and log the parameters' norm");
  p.store_true("--log-num-zeros-in-grad", &a.log_num_zeros_in_grad, "count and log the zeros in the gradient");
  p.store_true("--log-throughput", &a.log_throughput,
               "accepted for Megatron-LM compatibility: the log line always shows TFLOP/s per GPU");
  p.value("--metrics-jsonl", &a.metrics_jsonl,
          "megatron.cpp: append one JSON object per log line and validation to this file (for scripts)");
  p.value("--metrics-port", &a.metrics_port,
          "megatron.cpp: serve the live metrics in Prometheus' text format on this port of the logging rank "
          "(GET /metrics)",
          {0, 65535});
  p.value("--metrics-bind-address", &a.metrics_bind_address,
          "megatron.cpp: address --metrics-port listens on (default 127.0.0.1: this machine only)");
  p.value("--timing-log-option", &a.timing_log_option,
          "Megatron's timers across ranks: max, minmax (default) or all", {"max", "minmax", "all"});
  p.store_true("--log-op-breakdown", &a.log_op_breakdown,
               "megatron.cpp: print where the step time went by op category at the end (CUDA events on the GPU)");
  p.store_true("--exit-signal-handler", &a.exit_signal_handler,
               "on --exit-signal, save a checkpoint at the end of the current iteration and exit 0");
  p.value("--exit-signal", &a.exit_signal, "the signal --exit-signal-handler waits for (default SIGTERM)");
  p.value("--exit-duration-in-mins", &a.exit_duration_in_mins,
          "save a checkpoint and exit 0 once the run has trained this many minutes", {0, kMaxTimeoutMinutes});
  p.store_true("--check-for-nan-in-loss-and-grad", &a.check_for_nan_in_loss_and_grad,
               "stop on a NaN/Inf loss or grad norm, naming the iteration and rank (the default)");
  p.store_false("--no-check-for-nan-in-loss-and-grad", &a.check_for_nan_in_loss_and_grad,
                "on a NaN/Inf loss or grad norm, skip the update and count it instead of stopping");
  p.value("--rerun-mode", &a.rerun_mode,
          "Megatron's result validation by re-running steps: only 'disabled' is supported",
          {"disabled", "validate_results", "report_stats"});
  p.store_true("--log-straggler", &a.log_straggler,
               "each log interval, report the spread of step times over ranks and name the slowest");
  p.value("--straggler-minmax-count", &a.straggler_minmax_count,
          "with --log-straggler: how many slowest and fastest ranks to name (default 1)", {1, int64_t{1} << 20});
  for (const char* f : {"--straggler-ctrlr-port", "--disable-straggler-on-startup"})
    p.unsupported(f, "the straggler detector cannot be toggled at run time; --log-straggler reports every interval");
  p.unsupported("--check-for-spiky-loss", "part of the rerun state machine, which is not implemented");
  p.unsupported("--error-injection-rate", "part of the rerun state machine, which is not implemented");
}

void validate_ops_args(const OpsArgs& a) {
  if (a.metrics_port > 0 && !metrics_server_available())
    fail("--metrics-port: this build has no HTTP server library; install libcpp-httplib-dev "
         "(scripts/install_deps.sh) and rebuild");
  if (a.metrics_port == 0 && a.metrics_bind_address != "127.0.0.1")
    fail("--metrics-bind-address is for --metrics-port: give the port too");
  if (a.metrics_bind_address.empty()) fail("--metrics-bind-address: give an address such as 127.0.0.1 or 0.0.0.0");
  (void)exit_signal_number(a.exit_signal);
  if (a.rerun_mode != "disabled")
    fail("--rerun-mode {}: Megatron's rerun state machine is not implemented; use --rerun-mode disabled (a NaN loss "
         "or grad norm stops the run by --check-for-nan-in-loss-and-grad)",
         a.rerun_mode);
}

}  // namespace mt
