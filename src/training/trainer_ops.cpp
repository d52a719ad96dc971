// The trainer's side of operating a long run: the logging rank's metrics sinks (run_metrics.h),
// Megatron's timers (timers.h), --log-params-norm, --log-straggler, and the clean stops
// (exit_conditions.h). The loop in trainer.cpp calls these at fixed points of every iteration.
#include "core/log.h"
#include "training/straggler.h"
#include "training/trainer.h"

namespace mt {

void Trainer::setup_ops() {
  const bool gpu = args_.device == "cuda";
  const bool sinks = !args_.tensorboard_dir.empty() || !args_.metrics_jsonl.empty() || args_.metrics_port > 0;
  if (sinks && log_->is_log_rank()) {
    metrics_ = std::make_unique<RunMetrics>(RunMetricsOptions{args_, pg_.grid.world(), gpu});
    log_->set_metrics(metrics_.get());
    if (args_.metrics_port > 0)
      log_info("metrics: Prometheus text format at http://{}:{}/metrics", args_.metrics_bind_address,
               args_.metrics_port);
  }
  if (args_.timing_log_level > 0) {
    timers_ = std::make_unique<Timers>(static_cast<int>(args_.timing_log_level), args_.timing_log_option, pg_.world, gpu);
    step_->set_timers(timers_.get());
    if (args_.timing_log_level >= 2) pipeline_->set_phase_timer(timers_.get());
  }
  exit_ = std::make_unique<ExitConditions>(args_, pg_.world);
  if (exit_->enabled() && args_.save.empty())
    log_warn("--exit-signal-handler / --exit-duration-in-mins without --save: the run will stop without a checkpoint");
}

void Trainer::before_log(IterationResult& r) {
  // Collectives first, on every rank alike: the parameters' norm (Megatron computes it every
  // iteration with --log-params-norm), then at log lines the timers and the step-time spread.
  if (args_.log_params_norm)
    r.params_norm = parallel::global_params_norm(model_->params(), *ddp_, pg_, args_.model.moe.enabled());
  timer_report_ = {};
  straggler_line_.clear();
  if (state_.iteration % args_.log_interval != 0) return;
  if (timers_) {
    timer_report_ = timers_->report(interval_steps_);
    if (metrics_) metrics_->timers(state_.iteration, timer_report_.max_seconds);
  }
  if (args_.log_straggler) {
    const double mine = interval_step_s_ / static_cast<double>(std::max<int64_t>(interval_steps_, 1)) * 1e3;
    std::vector<double> all(static_cast<size_t>(pg_.world->size()));
    pg_.world->all_gather(&mine, all.data(), 1, comm::DataType::F64);
    straggler_line_ = format_straggler(all, args_.straggler_minmax_count);
  }
  interval_step_s_ = 0;
  interval_steps_ = 0;
}

void Trainer::after_log() {
  // Megatron prints the timers after the log line (on the last rank; here the logging rank).
  if (!timer_report_.text.empty()) log_->print(timer_report_.text);
  if (!straggler_line_.empty()) log_->print(straggler_line_);
}

void Trainer::report_validation(double loss, int64_t iteration) {
  log_->validation("validation", loss, iteration);
  if (metrics_) metrics_->validation(iteration, state_.consumed_train_samples, loss);
}

std::optional<std::string> Trainer::exit_requested() { return exit_->check(iterations_run_); }

}  // namespace mt
