#pragma once
// The pretraining run. Setup builds the engine in order: process groups (given) -> data
// parallelism (the model lays its parameters out in its buckets) -> model -> device -> pipeline
// -> schedule -> step runner (optimizer, loss scaler). The loop then reads data, calls the step
// runner (step_runner.h), and hands results to iteration logging (iteration_log.h), evaluation
// and checkpoints (trainer_checkpoint.cpp; the schema is in checkpoint/).
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "model/op_times.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/ddp.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"
#include "training/arguments.h"
#include "training/exit_conditions.h"
#include "training/batch_schedule.h"
#include "training/iteration_log.h"
#include "training/run_metrics.h"
#include "training/step_runner.h"
#include "training/timers.h"

namespace mt {

class Trainer {
 public:
  // `groups`: this rank's process groups (a single process by default). Each DP rank trains on
  // its slice of every global batch; loss, grad norm and the log line are global.
  Trainer(Arguments args, std::unique_ptr<data::Tokenizer> tokenizer,
          parallel::ProcessGroups groups = parallel::local_process_groups());
  ~Trainer();
  // Runs training to the end; returns the process exit code.
  int run();

  // Pieces exposed for tests.
  IterationResult train_step();
  double evaluate(data::SampleSource& source, int64_t& consumed, int64_t iters);
  model::GPTModel& model() { return *model_; }
  parallel::DataParallel& data_parallel() { return *ddp_; }
  parallel::PipelineRunner& pipeline() { return *pipeline_; }
  const parallel::ProcessGroups& groups() const { return pg_; }
  const checkpoint::TrainingState& state() const { return state_; }
  // --fp16: the loss scaler (made on first use from the --*loss-scale* flags); null otherwise.
  optim::GradScaler* grad_scaler();
  // Saves a checkpoint (starts it, with --async-save); completes a pending async save first.
  void save();
  void wait_for_saves() { saver_->wait(); }
  void load_for_test() { maybe_load(); }
  void set_data(std::unique_ptr<data::SampleSource> train, std::unique_ptr<data::SampleSource> valid);
  // The test split, evaluated once at the end of training (and by --skip-train), as Megatron does.
  void set_test_data(std::unique_ptr<data::SampleSource> test) { test_ = std::move(test); }

 private:
  // Setup, in order (the constructor).
  void setup_data_parallel();
  void setup_model();
  model::ContextParallel context_parallel() const;  // the model's CP groups and attention form
  void setup_device();
  void setup_pipeline();
  void setup_schedule();
  void setup_step_runner();

  // `cyclic`: sample positions go through this epoch's permutation (--dataloader-type cyclic).
  model::Batch make_batch(data::SampleSource& src, int64_t first, int64_t count, bool cyclic = false) const;
  int64_t cyclic_index(int64_t position, int64_t size) const;
  void evaluate_at_end();  // the validation and test sets at the current iteration
  std::vector<model::Batch> train_batches(int64_t global_batch_size);
  void maybe_load();
  void upcycle();  // --moe-use-upcycling
  void check_ckpt_format(int64_t it) const;  // --ckpt-format vs what --load holds
  void save_torch_dist(const checkpoint::TrainingState& st, const checkpoint::OptimizerState* os,
                       const checkpoint::SaveOptions& o);  // --ckpt-format torch_dist
  // Operating the run (trainer_ops.cpp): metrics sinks, timers, stopping, stragglers.
  void setup_ops();
  void before_log(IterationResult& r);  // every rank, after each step (collectives at log lines)
  void after_log();                     // the timer and straggler blocks after a log line
  void report_validation(double loss, int64_t iteration);
  std::optional<std::string> exit_requested();
  checkpoint::RankInfo rank_info() const;

  Arguments args_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  parallel::ProcessGroups pg_;
  std::unique_ptr<parallel::DataParallel> ddp_;
  std::unique_ptr<model::GPTModel> model_;
  std::unique_ptr<parallel::PipelineRunner> pipeline_;  // runs the micro-batches (any PP, also 1)
  std::unique_ptr<optim::LRSchedule> schedule_;
  std::unique_ptr<StepRunner> step_;
  std::unique_ptr<IterationLog> log_;
  std::unique_ptr<data::SampleSource> train_, valid_, test_;
  mutable std::vector<int64_t> cyclic_perm_;  // --dataloader-type cyclic: the permutation of epoch cyclic_epoch_
  mutable int64_t cyclic_epoch_ = -1;
  checkpoint::TrainingState state_;
  std::unique_ptr<checkpoint::Saver> saver_;
  model::OpTimes op_times_;
  bool time_ops_ = false;  // --log-op-breakdown
  double train_time_ = 0;  // wall time inside train_step, what the op breakdown is a share of
  bool breakdown_skipped_first_ = false;  // the op breakdown restarted after the first step
  int64_t total_iters_ = 0;
  std::unique_ptr<RunMetrics> metrics_;  // the logging rank's TensorBoard / JSON lines / Prometheus
  std::unique_ptr<Timers> timers_;       // Megatron's timers (--timing-log-level)
  std::unique_ptr<ExitConditions> exit_;  // --exit-signal-handler, --exit-duration-in-mins
  int64_t iterations_run_ = 0;            // by this process (the exit test hook's clock)
  double interval_step_s_ = 0;            // --log-straggler: this rank's step time in the interval
  int64_t interval_steps_ = 0;
  Timers::Report timer_report_;  // of the last log line
  std::string straggler_line_;
  BatchSchedule batch_schedule_;  // the global batch size at each step
};

}  // namespace mt
