#include "training/step_runner.h"

#include <cmath>
#include <cstdlib>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "training/timers.h"

namespace mt {

namespace {
// The compute copy that the optimizer step refreshes: the bf16 (fp16) copy of the parameters, or
// none in fp32 runs, whose model reads the main params.
ops::HalfCopy compute_copy(model::ParamStore& ps) {
  switch (ps.half()) {
    case model::Half::BF16: return {ps.model_buffer(), DType::BF16};
    case model::Half::FP16: return {ps.model_buffer(), DType::F16};
    case model::Half::None: break;
  }
  return {};
}
}  // namespace

StepRunner::StepRunner(StepOptions o, const parallel::ProcessGroups& pg, model::GPTModel& model,
                       parallel::DataParallel& ddp, parallel::PipelineRunner& pipeline,
                       const optim::LRSchedule& schedule, RngState dropout_rng, RngState tp_rng)
    : opt_(std::move(o)),
      pg_(pg),
      model_(model),
      ddp_(ddp),
      pipeline_(pipeline),
      schedule_(schedule),
      dropout_rng_(dropout_rng),
      tp_rng_(tp_rng),
      optimizer_(ddp_.make_optimizer(opt_.optimizer)) {
  // A test hook: the loss of iteration ITER is NaN on rank RANK (how a bad sample or an
  // overflow shows up), to check that the run stops there and names the rank.
  if (const char* h = std::getenv("MT_TEST_NAN_LOSS")) {
    long long it = 0, rank = -1;
    if (std::sscanf(h, "%lld:%lld", &it, &rank) == 2 && rank == pg_.rank) nan_test_iteration_ = it;
  }
}

StepRunner::~StepRunner() = default;

StepResult StepRunner::step(const std::vector<model::Batch>& batches, checkpoint::TrainingState& state,
                            model::OpTimes* times) {
  StepResult r;
  model::LossSums local;
  {
    TimerScope t(timers_, "forward-backward", 1);
    local = forward_backward(batches, times);
  }
  if (nan_test_iteration_ == state.iteration + 1) local.loss_sum = std::numeric_limits<double>::quiet_NaN();
  local_loss_finite_ = std::isfinite(local.loss_sum);
  finalize_grads(times);
  reduce_loss(local, r);
  reduce_moe_losses(static_cast<int64_t>(batches.size()), r);
  apply_update(r, state, times);
  if (model::Fp8Store* f = model_.fp8()) f->weights_changed();  // FP8 weights are quantized again
  state.iteration++;
  state.consumed_train_samples += opt_.global_batch_size;
  if (!r.skipped) state.scheduler_samples += opt_.global_batch_size;
  return r;
}

model::LossSums StepRunner::forward_backward(const std::vector<model::Batch>& batches, model::OpTimes* times) {
  double total_tokens = 0;
  for (const auto& b : batches)
    for (float x : b.loss_mask) total_tokens += x;
  total_tokens = pg_.dp->all_reduce_value(total_tokens);
  auto& ps = model_.params();
  ps.zero_grad();
  ddp_.start_iteration();
  ddp_.prepare_fp8_params();  // --fp8-param-gather: the first step's (or a resumed one's) FP8 weights
  // The reported loss and the gradient are the token-weighted mean over the global batch (all
  // DP ranks): each rank scales by 1 / global tokens and the DP reduction sums.
  const float scale = total_tokens > 0 ? static_cast<float>(1.0 / total_tokens) : 0.f;
  // --fp16: the backward starts from the loss times the loss scale (fp16 gradients would
  // underflow otherwise); the fp32 main grads are unscaled after the reduction.
  optim::GradScaler* scaler = grad_scaler();
  model::PassContext ctx;
  ctx.training = true;
  ctx.rng = &dropout_rng_;
  ctx.tp_rng = pg_.tp->size() > 1 ? &tp_rng_ : nullptr;
  ctx.times = times;
  // MoE: each micro-batch's auxiliary losses weigh 1 / (micro-batches x DP ranks) of the
  // gradient, as Megatron's MoEAuxLossAutoScaler (times the fp16 loss scale).
  moe_losses_ = {};
  ctx.moe_losses = &moe_losses_;
  ctx.moe_aux_grad_scale = static_cast<float>((scaler ? scaler->scale() : 1.0) /
                                              (static_cast<double>(batches.size()) * pg_.dp->size()));
  // Every stage reads the micro-batches (tokens on the first, labels on the last, the token
  // count everywhere); the schedule interleaves their passes (F0 B0 F1 B1 ... without PP).
  model::LossSums ls = pipeline_.train(batches, scaler ? scale * scaler->scale() : scale, ctx, &ddp_);
  // Gradients no weight GEMM wrote this step: zero_grad left them for their first write.
  ps.zero_unwritten_grads();
  ls.loss_sum += model_.collect_device_loss();  // on the GPU the sum stays on the device until here
  sync_rng_over_pipeline();
  return ls;
}

void StepRunner::sync_rng_over_pipeline() {
  if (pg_.pp->size() == 1) return;
  // A stage draws dropout offsets for its own layers only: move every stage's streams to the
  // furthest position, so they advance alike on all ranks and one saved offset resumes any.
  int64_t off[2] = {static_cast<int64_t>(dropout_rng_.offset), static_cast<int64_t>(tp_rng_.offset)};
  pg_.pp->all_reduce(off, 2, comm::ReduceOp::Max);
  dropout_rng_.offset = static_cast<uint64_t>(off[0]);
  tp_rng_.offset = static_cast<uint64_t>(off[1]);
}

void StepRunner::finalize_grads(model::OpTimes* times) {
  // The part of the gradient reduction that backward did not hide.
  model::ScopedOpTimer t(times, &model::OpTimes::communication);
  auto& ps = model_.params();
  {
    TimerScope t(timers_, "all-grads-sync", 1);
    ddp_.finish_grad_sync();
  }
  {
    TimerScope t(timers_, "embedding-grads-all-reduce", 1);
    parallel::all_reduce_embedding_grads(ps, *pg_.embedding);
  }
  {
    TimerScope t(timers_, "layernorm-grads-all-reduce", 1);  // the sequence-parallel norms' grads
    parallel::all_reduce_sequence_parallel_grads(ps, *pg_.tp);
  }
  update_expert_biases();
}

void StepRunner::update_expert_biases() {
  // DeepSeek-V3's loss-free balancing, where Megatron does it (finalize_model_grads): the step's
  // token counts over every rank that routes (TP x DP), then one step of the bias per expert.
  model_.for_each_moe_layer([&](model::MoELayer& l) {
    l.router.update_expert_bias([&](std::vector<double>& counts) {
      pg_.tp->all_reduce(counts.data(), counts.size());
      if (pg_.cp->size() > 1) pg_.cp->all_reduce(counts.data(), counts.size());
      pg_.dp->all_reduce(counts.data(), counts.size());
    });
  });
}

void StepRunner::reduce_moe_losses(int64_t micro_batches, StepResult& r) {
  const auto& moe = model_.config().moe;
  if (!moe.enabled()) return;
  // Megatron's tracker: load-balancing shares are summed over TP x CP (each rank holds part of
  // the loss), the z-loss averaged; then both averaged over DP and summed over the pipeline
  // stages' layers, per micro-batch and MoE layer.
  double v[3] = {moe_losses_.z_loss, moe_losses_.load_balancing, moe_losses_.seq_load_balancing};
  pg_.tp->all_reduce(v, 3);
  if (pg_.cp->size() > 1) pg_.cp->all_reduce(v, 3);
  v[0] /= static_cast<double>(pg_.tp->size()) * static_cast<double>(pg_.cp->size());
  pg_.dp->all_reduce(v, 3);
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(v, 3);
  const double per = static_cast<double>(pg_.dp->size()) * static_cast<double>(micro_batches) *
                     static_cast<double>(moe.num_moe_layers(model_.config().num_layers));
  if (moe.z_loss_coeff > 0) r.moe_losses.emplace_back("z_loss", v[0] / per);
  if (moe.aux_loss_coeff > 0 && moe.load_balancing_type == "aux_loss")
    r.moe_losses.emplace_back("load_balancing_loss", v[1] / per);
  if (moe.aux_loss_coeff > 0 && moe.load_balancing_type == "seq_aux_loss")
    r.moe_losses.emplace_back("seq_load_balancing_loss", v[2] / per);
}

void StepRunner::reduce_loss(const model::LossSums& local, StepResult& r) {
  // The loss is on the last stage: summed over DP, then over PP (zeros elsewhere), so every
  // rank has the global value and takes the same NaN/skip decision.
  double sums[2] = {local.loss_sum, local.tokens};
  pg_.dp_cp->all_reduce(sums, 2);  // CP ranks each hold part of every sequence's tokens
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(sums, 2);
  r.loss_sum = sums[0];
  r.tokens = sums[1];
}

void StepRunner::apply_update(StepResult& r, checkpoint::TrainingState& state, model::OpTimes* times) {
  TimerScope whole(timers_, "optimizer", 1);
  optim::GradScaler* scaler = grad_scaler();
  bool found_inf = false;
  if (scaler) {
    TimerScope t(timers_, "optimizer-unscale-and-check-inf", 1);
    found_inf = unscale_and_check(*scaler);
  }
  const bool moe = model_.config().moe.enabled();
  // Skipped for an overflow, the norm is not computed (Megatron's None; NaN here, left out of
  // the log line). Megatron's clip-main-grad timer covers the norm and the clipping.
  std::optional<TimerScope> clip_timer(std::in_place, timers_, "optimizer-clip-main-grad", 1);
  r.grad_norm = found_inf ? std::numeric_limits<double>::quiet_NaN()
                          : parallel::global_grad_norm(model_.params(), ddp_, pg_, moe);
  const double loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0.0;
  if (opt_.stop_on_nan && (!std::isfinite(loss) || (!found_inf && !std::isfinite(r.grad_norm))))
    stop_on_nan(loss, r.grad_norm, state.iteration + 1);
  clip_timer.reset();  // clip_and_step times the clipping itself
  if (opt_.count_zeros && !found_inf) {
    TimerScope t(timers_, "optimizer-count-zeros", 1);
    r.num_zeros = parallel::global_grad_zeros(model_.params(), ddp_, pg_, moe);
  }
  if (found_inf) {
    // An fp16 overflow: expected while the dynamic scale settles. Skipped and counted as
    // Megatron does (a nan iteration only when the loss itself is not finite).
    r.skipped = true;
    state.skipped_iterations++;
    if (!std::isfinite(loss)) state.nan_iterations++;
    log_debug("iteration {}: inf/nan in the fp16 gradients - update skipped, loss scale now {}", state.iteration + 1,
              scaler->scale());
  } else if (!std::isfinite(loss) || !std::isfinite(r.grad_norm)) {
    // Never continue silently on NaN/Inf: skip the update and report it with the iteration.
    r.skipped = true;
    state.nan_iterations++;
    state.skipped_iterations++;
    log_warn("iteration {}: {} is {} - update skipped", state.iteration + 1,
             std::isfinite(loss) ? "grad norm" : "loss", std::isfinite(loss) ? r.grad_norm : loss);
  } else {
    model::ScopedOpTimer t(times, &model::OpTimes::optimizer);
    clip_and_step(r.grad_norm, state);
  }
}

void StepRunner::stop_on_nan(double loss, double grad_norm, int64_t iteration) {
  // Every rank reaches here together (the loss and the norm are global). Name the first rank
  // whose own loss was not finite, else the first whose gradients hold a NaN/Inf.
  const bool loss_bad = !std::isfinite(loss);
  int64_t first = local_loss_finite_ ? INT64_MAX : pg_.rank;
  if (!loss_bad) {
    auto& ps = model_.params();
    const double sq = ops::grad_norm_squared(ps.grad_buffer(), {{0, ps.numel()}});
    first = std::isfinite(sq) ? INT64_MAX : pg_.rank;
  }
  first = pg_.world->all_reduce_value(first, comm::ReduceOp::Min);
  const std::string who = first == INT64_MAX ? std::string("(no single rank's own value)") : fmt::format("on rank {}", first);
  if (loss_bad)
    fail("iteration {}: the lm loss is {} {} (its local forward loss); stopping (--check-for-nan-in-loss-and-grad, "
         "Megatron's default): resume from the last checkpoint, or pass --no-check-for-nan-in-loss-and-grad to "
         "skip such iterations and count them",
         iteration, loss, who);
  fail("iteration {}: the grad norm is {}, first seen {} (its gradients after the data-parallel reduction); stopping "
       "(--check-for-nan-in-loss-and-grad, Megatron's default): resume from the last checkpoint, or pass "
       "--no-check-for-nan-in-loss-and-grad to skip such iterations and count them",
       iteration, grad_norm, who);
}

bool StepRunner::unscale_and_check(optim::GradScaler& scaler) {
  // Megatron's fp16 optimizer: unscale the grads this rank steps on (its owned slices with the
  // distributed optimizer), look for inf/nan, and agree over the model- and data-parallel
  // ranks, so every rank skips or steps alike; the scaler backs off or grows from the verdict.
  int64_t found = ops::unscale_and_check(model_.params().grad_buffer(), optimizer_ranges(), scaler.inv_scale()) ? 1 : 0;
  pg_.mp->all_reduce(&found, 1, comm::ReduceOp::Max);
  pg_.dp_cp->all_reduce(&found, 1, comm::ReduceOp::Max);
  scaler.update(found != 0);
  return found != 0;
}

void StepRunner::clip_and_step(double grad_norm, checkpoint::TrainingState& state) {
  auto& ps = model_.params();
  const int64_t steps = state.scheduler_samples;  // the scheduler counts samples of updates
  // The clipping is folded into the update (one pass over the grads fewer: 9 GB of traffic per
  // step for a 2B-parameter model); the update reads each grad as clip_grads would have left it.
  const float grad_scale = opt_.clip_grad > 0 ? ops::clip_coefficient(grad_norm, opt_.clip_grad) : 1.f;
  // The update writes the compute copy in the same pass; with the distributed optimizer the
  // parameter all-gather refreshes it instead, bucket by bucket, once the other slices are in.
  const bool gather = ddp_.sharded();
  // --fp8-param-gather: the FP8 weights are cast from the updated main values, gathered or not.
  const bool fp8_cast = ddp_.fp8_param_gather();
  {
    TimerScope t(timers_, "optimizer-inner-step", 1);
    const optim::StepRates rates{schedule_.lr(steps), schedule_.decoupled_lr(steps), schedule_.weight_decay(steps),
                                 grad_scale};
    optimizer_->update(ps.main_buffer(), ps.grad_buffer(), rates, gather ? ops::HalfCopy{} : compute_copy(ps));
  }
  if (gather || fp8_cast) {
    TimerScope t(timers_, "params-all-gather", 1);  // started here; with overlap it completes later
    ddp_.start_param_gather();
  }
  state.optimizer_steps = optimizer_->step_count();
}

optim::GradScaler* StepRunner::grad_scaler() {
  if (!opt_.loss_scaling) return nullptr;
  if (!grad_scaler_) grad_scaler_ = std::make_unique<optim::GradScaler>(*opt_.loss_scaling);
  return grad_scaler_.get();
}

std::vector<std::pair<int64_t, int64_t>> StepRunner::optimizer_ranges() const {
  // The distributed optimizer covers this rank's owned slices; otherwise the whole buffer.
  if (ddp_.sharded()) return ddp_.owned_ranges();
  return {{0, model_.params().numel()}};
}

}  // namespace mt
