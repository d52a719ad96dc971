#pragma once
// One training step, as a short list of named steps:
//
//   forward_backward   the pipeline's passes over this rank's micro-batches (gradient accumulation)
//   finalize_grads     the gradient reductions backward did not hide (DP, tied embeddings, SP)
//   reduce_loss        the loss over the global batch, the same value on every rank
//   apply_update       fp16 unscale and check -> grad norm -> NaN policy -> clip -> optimizer step
//
// The runner borrows what setup built (Trainer) and owns what only the step uses: the optimizer,
// the fp16 loss scaler and the dropout streams. Where the next capabilities go:
//   - MoE's auxiliary losses (load balancing, z-loss): summed in forward_backward beside
//     LossSums, reduced with the loss in reduce_loss and reported in StepResult.
//   - FP8's scaling state (amax histories, scales): owned by the model (model/fp8.h), updated in
//     the passes on the device; the runner tells it when an update changed the weights.
//   - Context parallelism's group: parallel::ProcessGroups (built before the Trainer); its
//     gradient all-reduce joins the others in finalize_grads, its loss sum in reduce_loss.
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/philox.h"
#include "model/gpt_model.h"
#include "model/moe/router.h"
#include "model/op_times.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/ddp.h"
#include "parallel/pipeline.h"
#include "parallel/process_groups.h"

namespace mt {

// What one step produced, summed over the global batch.
struct StepResult {
  double loss_sum = 0, tokens = 0;
  double grad_norm = 0;  // NaN when an fp16 overflow skipped the step
  bool skipped = false;
  // MoE models: the auxiliary losses as Megatron logs them (each loss / its coefficient, the mean
  // over micro-batches and MoE layers, averaged over data-parallel ranks), in its order; empty for
  // dense models.
  std::vector<std::pair<const char*, double>> moe_losses;
  // --log-params-norm / --log-num-zeros-in-grad (the trainer fills them; global values).
  std::optional<double> params_norm, num_zeros;
};
using IterationResult = StepResult;

// The step's settings (Arguments' optimizer section converts into it).
struct StepOptions {
  int64_t global_batch_size = 0;                        // samples a step consumes (all DP ranks)
  optim::OptimizerConfig optimizer;                     // weight_decay: the schedule's start value
  double clip_grad = 1.0;                               // 0: no clipping
  std::optional<optim::GradScalerConfig> loss_scaling;  // --fp16
  // --check-for-nan-in-loss-and-grad (default): a NaN/Inf loss or grad norm stops the run, naming
  // the iteration and the first rank that saw it; false: the update is skipped and counted.
  bool stop_on_nan = true;
  bool count_zeros = false;  // --log-num-zeros-in-grad: StepResult::num_zeros
};

class Timers;

class StepRunner {
 public:
  StepRunner(StepOptions o, const parallel::ProcessGroups& pg, model::GPTModel& model, parallel::DataParallel& ddp,
             parallel::PipelineRunner& pipeline, const optim::LRSchedule& schedule, RngState dropout_rng,
             RngState tp_rng);
  ~StepRunner();

  // One step over this rank's micro-batches; advances `state` (iteration, samples, skips).
  StepResult step(const std::vector<model::Batch>& batches, checkpoint::TrainingState& state, model::OpTimes* times);
  // A batch-size schedule (--rampup-batch-size, --step-batch-size-schedule) changes it between steps.
  void set_global_batch_size(int64_t samples) { opt_.global_batch_size = samples; }

  // --fp16: the loss scaler (made on first use); null otherwise.
  optim::GradScaler* grad_scaler();
  // The optimizer over this rank's optimizer ranges, on the parameters' device (its state is what
  // checkpoints save: Optimizer::state()).
  optim::Optimizer& optimizer() { return *optimizer_; }
  // Dropout streams: this stage's, and Megatron's model-parallel one (seed + 2718 + TP rank).
  RngState& dropout_rng() { return dropout_rng_; }
  RngState& tp_rng() { return tp_rng_; }
  // Megatron's timers of the step's phases (null: none).
  void set_timers(Timers* t) { timers_ = t; }

 private:
  model::LossSums forward_backward(const std::vector<model::Batch>& batches, model::OpTimes* times);
  void sync_rng_over_pipeline();
  void finalize_grads(model::OpTimes* times);
  void reduce_loss(const model::LossSums& local, StepResult& r);
  void reduce_moe_losses(int64_t micro_batches, StepResult& r);
  void update_expert_biases();
  void apply_update(StepResult& r, checkpoint::TrainingState& state, model::OpTimes* times);
  bool unscale_and_check(optim::GradScaler& scaler);
  [[noreturn]] void stop_on_nan(double loss, double grad_norm, int64_t iteration);
  void clip_and_step(double grad_norm, checkpoint::TrainingState& state);
  // The flat ranges this rank steps on: its owned slices with the distributed optimizer, else the
  // whole buffer.
  std::vector<std::pair<int64_t, int64_t>> optimizer_ranges() const;

  StepOptions opt_;
  const parallel::ProcessGroups& pg_;
  model::GPTModel& model_;
  parallel::DataParallel& ddp_;
  parallel::PipelineRunner& pipeline_;
  const optim::LRSchedule& schedule_;
  RngState dropout_rng_, tp_rng_;
  model::MoELossSums moe_losses_;  // this step's, summed by the MoE layers' training forwards
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::GradScaler> grad_scaler_;
  Timers* timers_ = nullptr;
  bool local_loss_finite_ = true;  // this rank's own loss sum, before the reduction
  int64_t nan_test_iteration_ = 0;  // MT_TEST_NAN_LOSS=ITER:RANK (tests): this rank's loss is NaN there
};

}  // namespace mt
