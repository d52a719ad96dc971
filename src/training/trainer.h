#pragma once
// The pretraining loop: data -> micro-batches -> forward/backward with gradient accumulation ->
// clip -> optimizer -> schedule; Megatron's log line, evaluation and checkpoints.
#include <memory>

#include "checkpoint/checkpoint.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "model/op_times.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/ddp.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"
#include "training/arguments.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/optimizer.h"
#endif

namespace mt {

struct IterationResult {
  double loss_sum = 0, tokens = 0;
  double grad_norm = 0;
  bool skipped = false;
};

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
  model::Batch make_batch(data::SampleSource& src, int64_t first, int64_t count) const;
  void maybe_load();
  checkpoint::RankInfo rank_info() const;
  std::vector<std::pair<int64_t, int64_t>> optimizer_ranges() const;
  nlohmann::json model_args_json() const;
  void log_iteration(double elapsed_s, double loss, double grad_norm, int64_t tokens);
  void print_validation(const char* set, double loss);
  void print_log_line(const std::string& text) const;
  void log_op_breakdown();  // --timing-log-level: where the step time went (every pipeline stage)

  Arguments args_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  parallel::ProcessGroups pg_;
  std::unique_ptr<parallel::DataParallel> ddp_;
  RngState tp_rng_;  // Megatron's model-parallel RNG stream (seed + 2718 + TP rank)
  std::unique_ptr<model::GPTModel> model_;
  std::unique_ptr<parallel::PipelineRunner> pipeline_;  // runs the micro-batches (any PP, also 1)
  int log_rank_ = 0;                                     // prints the iteration and validation lines
  // The host optimizer: steps on the CPU; on the GPU only the staging area of checkpoints, so it
  // is made (with its full-size fp32 arrays) the first time a checkpoint needs it.
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::Optimizer& host_optimizer();
#ifdef MT_HAVE_CUDA
  // --device cuda: AdamW on the device over this rank's optimizer ranges (the whole buffer, or
  // the owned slices with the distributed optimizer), in optimizer_ranges() order.
  struct GpuAdamPart {
    int64_t lo = 0, hi = 0;
    std::unique_ptr<ops::gpu::AdamW> opt;
  };
  std::vector<GpuAdamPart> gpu_adam_;
  void gpu_optimizer_to_host();  // for checkpoints: the host optimizer's arrays mirror the GPU's
  void host_optimizer_to_gpu();
#endif
  std::unique_ptr<optim::LRSchedule> schedule_;
  std::unique_ptr<optim::GradScaler> grad_scaler_;  // see grad_scaler()
  std::unique_ptr<data::SampleSource> train_, valid_;
  checkpoint::TrainingState state_;
  std::unique_ptr<checkpoint::Saver> saver_;
  RngState dropout_rng_;
  model::OpTimes op_times_;
  bool time_ops_ = true;   // on the GPU only with --timing-log-level >= 1
  double train_time_ = 0;  // wall time inside train_step, what the op breakdown is a share of
  int64_t total_iters_ = 0;
  // Accumulated over a log interval, as Megatron averages the logged loss.
  double interval_loss_sum_ = 0, interval_tokens_ = 0, interval_time_ = 0;
  int64_t interval_iters_ = 0, interval_tokens_count_ = 0;
  int64_t logged_skipped_ = 0, logged_nan_ = 0;  // totals at the last log line
  double last_lr_ = 0;
};

// Megatron's model/tokenizer arguments as stored in checkpoints (for generate and resume checks).
nlohmann::json model_args_to_json(const Arguments& a);
void model_args_from_json(const nlohmann::json& j, Arguments& a);

}  // namespace mt
