#pragma once
// Pretrain's operations section: what a long run shows while it runs (TensorBoard, a JSON-lines
// metrics file, a Prometheus endpoint, Megatron's timers, straggler reports), how it stops
// (signals, a time limit) and what it does on NaN. Registered from arguments.cpp; the flags are
// in arguments_ops.cpp.
#include <cstdint>
#include <string>

namespace mt {

struct OpsArgs {
  // TensorBoard (Megatron's names and defaults).
  std::string tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;  // events buffered before a write to disk
  bool log_timers_to_tensorboard = false, log_memory_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false, log_world_size_to_tensorboard = false;
  bool log_loss_scale_to_tensorboard = true;  // --no-log-loss-scale-to-tensorboard
  bool log_params_norm = false, log_num_zeros_in_grad = false;
  bool log_throughput = false;  // accepted: the log line always shows throughput
  // megatron.cpp: one JSON object per log line / validation, for scripts.
  std::string metrics_jsonl;
  // megatron.cpp: Prometheus text format over HTTP on the logging rank (0: off).
  int64_t metrics_port = 0;
  std::string metrics_bind_address = "127.0.0.1";
  // Megatron's timers (--timing-log-level is in LoggingArgs).
  std::string timing_log_option = "minmax";  // max | minmax | all
  bool log_op_breakdown = false;             // megatron.cpp: the per-op-category breakdown at the end
  // Stopping.
  bool exit_signal_handler = false;
  std::string exit_signal = "SIGTERM";
  int64_t exit_duration_in_mins = 0;  // 0: no limit
  // Numerics: stop on a NaN/Inf loss or grad norm (Megatron's default), or skip and count.
  bool check_for_nan_in_loss_and_grad = true;
  std::string rerun_mode = "disabled";
  // Stragglers.
  bool log_straggler = false;
  int64_t straggler_minmax_count = 1;
};

// The signal number of --exit-signal's name (SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGHUP, with or
// without the SIG prefix); fails naming the flag otherwise.
int exit_signal_number(const std::string& name);

}  // namespace mt
