#pragma once
// Where a run's numbers go besides the log line: TensorBoard (tensorboard.h, Megatron's scalar
// names and intervals), a JSON-lines file for scripts (--metrics-jsonl) and a Prometheus endpoint
// (metrics_server.h). IterationLog hands every iteration and every log line here; only the
// logging rank (the one that prints the log line) makes a RunMetrics.
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "training/arguments_ops.h"
#include "training/metrics_server.h"
#include "training/tensorboard.h"

namespace mt {

// One iteration's values (Megatron writes these to TensorBoard every --tensorboard-log-interval).
struct IterationMetrics {
  int64_t iteration = 0, consumed_samples = 0, batch_size = 0;
  double learning_rate = 0, lm_loss = 0, loss_scale = 1;
  double grad_norm = 0;  // NaN: none (an fp16 overflow skipped the step)
  std::optional<double> params_norm, num_zeros;
  std::vector<std::pair<const char*, double>> moe_losses;
};

// One log line's values: averages over the interval.
struct IntervalMetrics {
  int64_t iteration = 0, total_iters = 0, consumed_samples = 0, batch_size = 0;
  double iteration_time_s = 0, tflops_per_gpu = 0, tokens_per_s = 0, learning_rate = 0, lm_loss = 0, loss_scale = 1;
  double grad_norm = 0;  // of the interval's last iteration; NaN: none
  std::optional<double> params_norm, num_zeros;
  int64_t skipped = 0, nan = 0;              // in this interval
  int64_t skipped_total = 0, nan_total = 0;  // since the start of training
  std::vector<std::pair<const char*, double>> moe_losses;
};

// Memory, as the run can see it: the GPU allocator's peak on the GPU, else this process's
// resident set (current and peak).
struct MemoryMetrics {
  double allocated_bytes = 0, max_allocated_bytes = 0;
};
MemoryMetrics memory_metrics(bool gpu);

struct RunMetricsOptions {
  OpsArgs ops;
  int64_t world_size = 1;
  bool gpu = false;  // --device cuda: memory is the GPU allocator's
};

class RunMetrics {
 public:
  explicit RunMetrics(RunMetricsOptions o);
  ~RunMetrics();

  void iteration(const IterationMetrics& m);
  void interval(const IntervalMetrics& m);
  // Megatron's timers of the interval, seconds per iteration (the max over ranks).
  void timers(int64_t iteration, const std::vector<std::pair<std::string, double>>& max_seconds);
  void validation(int64_t iteration, int64_t consumed_samples, double loss);
  void flush();

 private:
  void scalar(const std::string& tag, double value, int64_t iteration, int64_t samples);
  void jsonl(const std::string& line);

  RunMetricsOptions o_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::unique_ptr<MetricsServer> server_;
  std::ofstream jsonl_;
  std::vector<std::pair<std::string, double>> pending_timers_;  // joined to the next JSON line
};

}  // namespace mt
