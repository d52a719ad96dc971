#pragma once
// Iteration logging: Megatron's log line every --log-interval iterations (its loss averaged over
// the interval, its skipped/nan counts per interval), the progress bar between lines, the
// validation block and the op-time breakdown. It owns the interval counters; the step and the
// training state are only read. Lines come from the rank that holds the loss (print_rank_last).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/config.h"
#include "model/fp8.h"
#include "model/op_times.h"
#include "parallel/process_groups.h"
#include "training/run_metrics.h"
#include "training/step_runner.h"

namespace mt {

struct IterationLogOptions {
  int64_t log_interval = 100;
  int64_t total_iters = 0;
  int64_t global_batch_size = 0;
  bool progress_bar = true;  // on a terminal only
  bool show_mfu = false;     // --device cuda: MFU against an H100's dense bf16 peak
  // --device cuda: Megatron's "throughput per GPU (TFLOP/s/GPU)". On the CPU there is no GPU to
  // divide by: the line says "throughput (TFLOP/s)" and gives the whole run's rate.
  bool per_gpu = false;
};

class IterationLog {
 public:
  IterationLog(IterationLogOptions o, const model::TransformerConfig& model, const parallel::ProcessGroups& pg);

  // Starts the first interval (after a resume: the skip counts the checkpoint brought).
  void start(const checkpoint::TrainingState& state);
  // Counts a finished step; prints the log line at the end of an interval, else moves the bar.
  // `lr`: the learning rate after the step; `scaler`: null without --fp16.
  void record(const StepResult& r, const checkpoint::TrainingState& state, double lr, const optim::GradScaler* scaler);
  void set_global_batch_size(int64_t samples) { opt_.global_batch_size = samples; }  // a batch-size schedule's
  // Time spent outside training (evaluation, checkpoints) that the iteration time leaves out.
  void exclude(double seconds) { t_interval_ += seconds; }
  void validation(const char* set, double loss, int64_t iteration) const;
  // The logging rank's metrics sinks (TensorBoard, JSON lines, Prometheus); null elsewhere.
  void set_metrics(RunMetrics* m) { metrics_ = m; }
  bool is_log_rank() const { return pg_.rank == log_rank_; }
  // --log-op-breakdown: where the step time went (every pipeline stage's line).
  void op_breakdown(model::OpTimes& times, double train_time) const;
  void print(const std::string& text) const;
  // FP8 runs: the log line reports this rank's FP8 health (model/fp8.h: take_fp8_health).
  void set_fp8(model::Fp8Store* fp8) { fp8_ = fp8; }
  static double now_s();  // the clock of the iteration times (steady, seconds)

 private:
  void print_line(double elapsed_s, double loss, const StepResult& r, const checkpoint::TrainingState& state,
                  double lr, const optim::GradScaler* scaler);

  std::string moe_line() const;
  std::string progress(int64_t it) const;
  std::string fp8_line();

  IterationLogOptions opt_;
  const model::TransformerConfig& model_;
  const parallel::ProcessGroups& pg_;
  model::Fp8Store* fp8_ = nullptr;
  int log_rank_ = 0;  // prints the iteration and validation lines
  bool bar_ = false;
  double t_interval_ = 0;
  // Accumulated over a log interval, as Megatron averages the logged loss.
  double loss_sum_ = 0, tokens_ = 0;
  std::vector<std::pair<const char*, double>> moe_losses_;  // MoE auxiliary losses, summed
  int64_t iters_ = 0, tokens_count_ = 0;
  int64_t advanced_ = 0;  // iterations of the interval that updated (not skipped)
  int64_t logged_skipped_ = 0, logged_nan_ = 0;  // totals at the last log line
  RunMetrics* metrics_ = nullptr;
  double t_start_ = 0;        // for the progress line's ETA
  int64_t start_iter_ = 0;
};

}  // namespace mt
