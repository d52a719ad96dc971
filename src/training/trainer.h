#pragma once
// The pretraining run. Setup builds the engine in order: process groups (given) -> data
// parallelism (the model lays its parameters out in its buckets) -> model -> device -> pipeline
// -> schedule -> step runner (optimizer, loss scaler). The loop then reads data, calls the step
// runner (step_runner.h), and hands results to iteration logging (iteration_log.h), evaluation
// and checkpoints (trainer_checkpoint.cpp; the schema is in checkpoint/).
#include <memory>

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
#include "training/iteration_log.h"
#include "training/step_runner.h"

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

 private:
  // Setup, in order (the constructor).
  void setup_data_parallel();
  void setup_model();
  model::ContextParallel context_parallel() const;  // the model's CP groups and attention form
  void setup_device();
  void setup_pipeline();
  void setup_schedule();
  void setup_step_runner();

  model::Batch make_batch(data::SampleSource& src, int64_t first, int64_t count) const;
  std::vector<model::Batch> train_batches();
  void maybe_load();
  void upcycle();  // --moe-use-upcycling
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
  std::unique_ptr<data::SampleSource> train_, valid_;
  checkpoint::TrainingState state_;
  std::unique_ptr<checkpoint::Saver> saver_;
  model::OpTimes op_times_;
  bool time_ops_ = true;   // on the GPU only with --timing-log-level >= 1
  double train_time_ = 0;  // wall time inside train_step, what the op breakdown is a share of
  int64_t total_iters_ = 0;
};

}  // namespace mt
