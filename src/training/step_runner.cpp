#include "training/step_runner.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/optimizer.h"
#endif

namespace mt {

// ---------------------------------------------------------------------------------------------
// GPU optimizer (--device cuda): the one place the step knows the device. AdamW and the fp16
// unscale run as ops::gpu calls over this rank's optimizer ranges; checkpoints see the state
// through the host optimizer's arrays. When the CUDA AdamW becomes an optim::Optimizer (issue
// #16, item 1), this block goes and apply_update has one path.
#ifdef MT_HAVE_CUDA
struct StepRunner::DeviceOptimizer {
  // One AdamW per optimizer range (the whole buffer, or the owned slices with the distributed
  // optimizer), in optimizer_ranges() order.
  struct Part {
    int64_t lo = 0, hi = 0;
    std::unique_ptr<ops::gpu::AdamW> opt;
  };
  std::vector<Part> parts;

  DeviceOptimizer(model::ParamStore& ps, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                  const optim::OptimizerConfig& o) {
    for (auto [lo, hi] : ranges)
      parts.push_back({lo, hi,
                       std::make_unique<ops::gpu::AdamW>(hi - lo, parallel::spans_within(ps.spans(), lo, hi), o.adam_beta1,
                                                         o.adam_beta2, o.adam_eps, ps.model_buffer().dtype())});
  }

  static bool unscale_and_check(float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges, float inv) {
    return ops::gpu::unscale_and_check(grads, ranges, inv);  // one device flag, read once
  }

  // Clips and steps; returns the optimizer's step count.
  int64_t clip_and_step(model::ParamStore& ps, double grad_norm, double max_norm, double lr, double wd) {
    float* grads = ps.grad_buffer().data<float>();
    if (max_norm > 0) ops::gpu::clip_grads(grads, ps.numel(), grad_norm, max_norm);
    // The update also writes the bf16 (fp16) compute copy of the owned ranges: no separate sync pass.
    float* main = ps.main_buffer().data<float>();
    uint16_t* model16 = ps.model_buffer().data<uint16_t>();
    for (auto& part : parts) part.opt->step(main + part.lo, grads + part.lo, model16 + part.lo, lr, wd);
    return parts.front().opt->step_count();
  }

  // The host optimizer's arrays of one kind, one per part.
  std::vector<std::vector<float>*> host_arrays(optim::Optimizer& host, const char* name) const {
    std::vector<std::vector<float>*> out;
    for (auto& [n, v] : host.state())
      if (n == name) out.push_back(v);
    MT_CHECK(out.size() == parts.size(), "internal: the host optimizer has {} '{}' arrays for {} GPU optimizer ranges",
             out.size(), name, parts.size());
    return out;
  }

  void to_host(optim::Optimizer& host) const {
    auto m = host_arrays(host, "exp_avg");
    auto v = host_arrays(host, "exp_avg_sq");
    for (size_t i = 0; i < parts.size(); ++i) {
      const size_t bytes = static_cast<size_t>(parts[i].hi - parts[i].lo) * 4;
      device_copy(m[i]->data(), Device::CPU, parts[i].opt->exp_avg(), Device::CUDA, bytes);
      device_copy(v[i]->data(), Device::CPU, parts[i].opt->exp_avg_sq(), Device::CUDA, bytes);
    }
    host.set_step_count(parts.front().opt->step_count());
  }

  void from_host(optim::Optimizer& host) {
    auto m = host_arrays(host, "exp_avg");
    auto v = host_arrays(host, "exp_avg_sq");
    for (size_t i = 0; i < parts.size(); ++i) {
      const size_t bytes = static_cast<size_t>(parts[i].hi - parts[i].lo) * 4;
      device_copy(parts[i].opt->exp_avg(), Device::CUDA, m[i]->data(), Device::CPU, bytes);
      device_copy(parts[i].opt->exp_avg_sq(), Device::CUDA, v[i]->data(), Device::CPU, bytes);
      parts[i].opt->set_step_count(host.step_count());
    }
  }
};
#else
// Built without CUDA: never made (device_opt_ stays null), so these are never called.
struct StepRunner::DeviceOptimizer {
  DeviceOptimizer(model::ParamStore&, const std::vector<std::pair<int64_t, int64_t>>&,
                  const optim::OptimizerConfig&) {
    fail("--device cuda: this build has no CUDA backend");
  }
  static bool unscale_and_check(float*, const std::vector<std::pair<int64_t, int64_t>>&, float) { return false; }
  int64_t clip_and_step(model::ParamStore&, double, double, double, double) { return 0; }
  void to_host(optim::Optimizer&) const {}
  void from_host(optim::Optimizer&) {}
};
#endif
// ---------------------------------------------------------------------------------------------

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
      tp_rng_(tp_rng) {
  if (opt_.device_optimizer) {
    device_opt_ = std::make_unique<DeviceOptimizer>(model_.params(), optimizer_ranges(), opt_.optimizer);
  } else {
    optimizer_ = ddp_.make_optimizer(opt_.optimizer);
  }
}

StepRunner::~StepRunner() = default;

StepResult StepRunner::step(const std::vector<model::Batch>& batches, checkpoint::TrainingState& state,
                            model::OpTimes* times) {
  StepResult r;
  const model::LossSums local = forward_backward(batches, times);
  finalize_grads(times);
  reduce_loss(local, r);
  reduce_moe_losses(static_cast<int64_t>(batches.size()), r);
  apply_update(r, state, times);
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
  ddp_.finish_grad_sync();
  parallel::all_reduce_embedding_grads(ps, *pg_.embedding);
  parallel::all_reduce_sequence_parallel_grads(ps, *pg_.tp);
  update_expert_biases();
}

void StepRunner::update_expert_biases() {
  // DeepSeek-V3's loss-free balancing, where Megatron does it (finalize_model_grads): the step's
  // token counts over every rank that routes (TP x DP), then one step of the bias per expert.
  model_.for_each_moe_layer([&](model::MoELayer& l) {
    l.router.update_expert_bias([&](std::vector<double>& counts) {
      pg_.tp->all_reduce(counts.data(), counts.size());
      pg_.dp->all_reduce(counts.data(), counts.size());
    });
  });
}

void StepRunner::reduce_moe_losses(int64_t micro_batches, StepResult& r) {
  const auto& moe = model_.config().moe;
  if (!moe.enabled()) return;
  // Megatron's tracker: load-balancing shares are summed over TP (each rank holds part of the
  // loss), the z-loss averaged; then both averaged over DP and summed over the pipeline stages'
  // layers, per micro-batch and MoE layer.
  double v[3] = {moe_losses_.z_loss, moe_losses_.load_balancing, moe_losses_.seq_load_balancing};
  pg_.tp->all_reduce(v, 3);
  v[0] /= pg_.tp->size();
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
  pg_.dp->all_reduce(sums, 2);
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(sums, 2);
  r.loss_sum = sums[0];
  r.tokens = sums[1];
}

void StepRunner::apply_update(StepResult& r, checkpoint::TrainingState& state, model::OpTimes* times) {
  optim::GradScaler* scaler = grad_scaler();
  const bool found_inf = scaler && unscale_and_check(*scaler);
  // Skipped for an overflow, the norm is not computed (Megatron's None; NaN here, left out of
  // the log line).
  r.grad_norm = found_inf ? std::numeric_limits<double>::quiet_NaN()
                          : parallel::global_grad_norm(model_.params(), ddp_, pg_, model_.config().moe.enabled());
  const double loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0.0;
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

bool StepRunner::unscale_and_check(optim::GradScaler& scaler) {
  // Megatron's fp16 optimizer: unscale the grads this rank steps on (its owned slices with the
  // distributed optimizer), look for inf/nan, and agree over the model- and data-parallel
  // ranks, so every rank skips or steps alike; the scaler backs off or grows from the verdict.
  auto& ps = model_.params();
  float* grads = ps.grad_buffer().data<float>();
  const float inv = scaler.inv_scale();
  int64_t found = 0;
  if (ps.grad_buffer().device() == Device::CUDA) {
    found = DeviceOptimizer::unscale_and_check(grads, optimizer_ranges(), inv) ? 1 : 0;
  } else {
    for (auto [lo, hi] : optimizer_ranges()) found |= optim::unscale_and_check(grads + lo, hi - lo, inv) ? 1 : 0;
  }
  pg_.mp->all_reduce(&found, 1, comm::ReduceOp::Max);
  pg_.dp->all_reduce(&found, 1, comm::ReduceOp::Max);
  scaler.update(found != 0);
  return found != 0;
}

void StepRunner::clip_and_step(double grad_norm, checkpoint::TrainingState& state) {
  auto& ps = model_.params();
  const int64_t steps = state.scheduler_samples;  // the scheduler counts samples of updates
  if (device_opt_) {
    state.optimizer_steps = device_opt_->clip_and_step(ps, grad_norm, opt_.clip_grad, schedule_.lr(steps),
                                                       schedule_.weight_decay(steps));
    if (ddp_.sharded()) ddp_.start_param_gather();  // the other ranks' slices
    return;
  }
  float* grads = ps.grad_buffer().data<float>();
  if (opt_.clip_grad > 0) optim::clip_grads(grads, ps.numel(), grad_norm, opt_.clip_grad);
  optimizer_->step(ps.main_buffer().data<float>(), grads, static_cast<float>(schedule_.lr(steps)),
                   static_cast<float>(schedule_.weight_decay(steps)));
  if (ddp_.sharded()) ddp_.start_param_gather();  // refreshes the compute copy per bucket
  else ps.sync_model_from_main();
  state.optimizer_steps = optimizer_->step_count();
}

optim::GradScaler* StepRunner::grad_scaler() {
  if (!opt_.loss_scaling) return nullptr;
  if (!grad_scaler_) grad_scaler_ = std::make_unique<optim::GradScaler>(*opt_.loss_scaling);
  return grad_scaler_.get();
}

optim::Optimizer& StepRunner::host_optimizer() {
  if (!optimizer_) optimizer_ = ddp_.make_optimizer(opt_.optimizer);
  return *optimizer_;
}

void StepRunner::optimizer_state_to_host() {
  if (device_opt_) device_opt_->to_host(host_optimizer());
}

void StepRunner::optimizer_state_from_host() {
  if (device_opt_) device_opt_->from_host(host_optimizer());
}

std::vector<std::pair<int64_t, int64_t>> StepRunner::optimizer_ranges() const {
  // The distributed optimizer covers this rank's owned slices; otherwise the whole buffer.
  if (ddp_.sharded()) return ddp_.owned_ranges();
  return {{0, model_.params().numel()}};
}

}  // namespace mt
