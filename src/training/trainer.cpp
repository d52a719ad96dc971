#include "training/trainer.h"

#include <exception>

#include "core/error.h"
#include "core/log.h"
#include "kernels/device.h"

namespace mt {

Trainer::Trainer(Arguments args, std::unique_ptr<data::Tokenizer> tokenizer, parallel::ProcessGroups groups)
    : args_(std::move(args)), tokenizer_(std::move(tokenizer)), pg_(std::move(groups)) {
  const int64_t gbs = args_.global_batch_size;
  total_iters_ = args_.train_iters > 0 ? args_.train_iters : args_.train_samples / gbs;
  if (total_iters_ <= 0) fail("--train-samples ({}) is smaller than one global batch ({})", args_.train_samples, gbs);
  MT_CHECK(pg_.tp->size() == args_.tensor_model_parallel_size && pg_.dp->size() == args_.data_parallel_size,
           "process groups (tp {}, dp {}) do not match the arguments (tp {}, dp {})", pg_.tp->size(), pg_.dp->size(),
           args_.tensor_model_parallel_size, args_.data_parallel_size);
  MT_CHECK(pg_.pp->size() == args_.pipeline_model_parallel_size, "pipeline group of {} ranks for {} stages",
           pg_.pp->size(), args_.pipeline_model_parallel_size);
  MT_CHECK(pg_.ep->size() == args_.expert_model_parallel_size, "expert-parallel group of {} ranks for EP {}",
           pg_.ep->size(), args_.expert_model_parallel_size);
  setup_data_parallel();
  setup_model();
  setup_pipeline();
  saver_ = std::make_unique<checkpoint::Saver>(rank_info());
  setup_device();
  setup_schedule();
  setup_step_runner();
  IterationLogOptions lo;
  lo.log_interval = args_.log_interval;
  lo.total_iters = total_iters_;
  lo.global_batch_size = gbs;
  lo.progress_bar = args_.log_progress_bar;
  lo.show_mfu = lo.per_gpu = args_.device == "cuda";
  log_ = std::make_unique<IterationLog>(lo, args_.model, pg_);
}

void Trainer::setup_data_parallel() {
  // MoE experts' gradients reduce over the expert-data-parallel group (parallel/grid.h).
  ddp_ = std::make_unique<parallel::DataParallel>(pg_.dp, ddp_options(args_), pg_.edp);
}

void Trainer::setup_model() {
  // This rank's pipeline part: its layer chunks, the embedding on the first stage, the head on the last.
  const parallel::PipelineLayout layout(args_.model.num_layers, pipeline_options(args_));
  model::PipelinePart part{layout.chunks(pg_.pp->rank()), pg_.pp->rank() == 0, pg_.pp->rank() == pg_.pp->size() - 1};
  model_ = std::make_unique<model::GPTModel>(
      args_.model, model::ModelOptions{pg_.tp.get(), args_.sequence_parallel, ddp_->layout_fn(), std::move(part),
                                       args_.tp_comm_overlap, {pg_.ep.get(), pg_.etp.get(), pg_.tp_ep.get()}});
}

void Trainer::setup_pipeline() {
  pipeline_ = std::make_unique<parallel::PipelineRunner>(*model_, pg_.pp, args_.microbatch_group_size_per_vp_stage);
  ddp_->attach(model_->params());
}

// --device cuda moves the parameters and grads to the GPU (the step runner's optimizer then makes
// its state there); the host keeps the loop. The run picked the device and made its GPU context
// (and set the attention backend) in pretrain.
void Trainer::setup_device() {
  if (args_.device != "cuda") return;
  ops::gpu_context();  // fails if the run made none
  model_->to_device(Device::CUDA);
  time_ops_ = args_.timing_log_level >= 1;
  if (time_ops_) op_times_.set_device(Device::CUDA);
}

void Trainer::setup_schedule() { schedule_ = std::make_unique<optim::LRSchedule>(schedule_config(args_, args_)); }

void Trainer::setup_step_runner() {
  StepOptions so;
  so.global_batch_size = args_.global_batch_size;
  so.optimizer = args_.optimizer;
  so.optimizer.weight_decay = static_cast<float>(args_.start_weight_decay);
  so.clip_grad = args_.clip_grad;
  if (args_.model.fp16) so.loss_scaling = args_.grad_scaler;
  // Megatron seeds each pipeline stage's dropout with seed + 100 x stage, so stages that draw
  // the same offsets still get different masks.
  const uint64_t stage_seed = args_.seed + 100 * static_cast<uint64_t>(pg_.pp->rank());
  step_ = std::make_unique<StepRunner>(so, pg_, *model_, *ddp_, *pipeline_, *schedule_, RngState{stage_seed, 0},
                                       RngState{stage_seed + 2718 + static_cast<uint64_t>(pg_.tp_rank()), 0});
  if (ddp_->sharded()) {
    int64_t owned = 0;
    for (auto [lo, hi] : ddp_->owned_ranges()) owned += hi - lo;
    const double per = args_.optimizer.type == "adam" ? 8.0 : 4.0;  // fp32 moments per element
    const auto& ps = model_->params();
    const std::string split = ddp_->has_expert_buckets() ? fmt::format("dense over DP {}, experts over expert DP {}",
                                                                       pg_.dp->size(), pg_.edp->size())
                                                           : fmt::format("1/{}", pg_.dp->size());
    log_info("distributed optimizer: this rank's optimizer state covers {} of {} elements ({}): {:.2f} MiB instead "
             "of {:.2f} MiB",
             owned, ps.numel(), split, static_cast<double>(owned) * per / 1048576.0,
             static_cast<double>(ps.numel()) * per / 1048576.0);
  }
}

Trainer::~Trainer() {
  if (!ddp_ || !model_ || !ddp_->param_gather_pending()) return;
  // --overlap-param-gather: the last step's all-gather may still write into the model's
  // buffers, so it must land before they are freed. When unwinding from a failure a dead peer
  // could make that wait block instead; the process is on its way out, so the buffers are
  // left to it.
  if (std::uncaught_exceptions() > 0) {
    (void)model_.release();
    return;
  }
  try {
    ddp_->finish_param_gather();
  } catch (const std::exception&) {
    (void)model_.release();
  }
}

void Trainer::set_data(std::unique_ptr<data::SampleSource> train, std::unique_ptr<data::SampleSource> valid) {
  train_ = std::move(train);
  valid_ = std::move(valid);
}

model::Batch Trainer::make_batch(data::SampleSource& src, int64_t first, int64_t count) const {
  const int64_t S = args_.model.seq_length;
  model::Batch b;
  b.B = count;
  b.S = S;
  b.tokens.resize(static_cast<size_t>(count * S));
  b.labels.resize(static_cast<size_t>(count * S));
  b.loss_mask.assign(static_cast<size_t>(count * S), 1.f);
  std::vector<int32_t> buf(static_cast<size_t>(S + 1));
  const int32_t eod = tokenizer_ ? tokenizer_->eod() : -1;
  for (int64_t i = 0; i < count; ++i) {
    int64_t idx = (first + i) % src.size();
    src.get(idx, buf.data());
    for (int64_t t = 0; t < S; ++t) {
      size_t o = static_cast<size_t>(i * S + t);
      b.tokens[o] = buf[static_cast<size_t>(t)];
      b.labels[o] = buf[static_cast<size_t>(t + 1)];
      // Megatron masks the loss where the *input* token is EOD when --eod-mask-loss is set.
      if (args_.eod_mask_loss && buf[static_cast<size_t>(t)] == eod) b.loss_mask[o] = 0.f;
    }
  }
  return b;
}

optim::GradScaler* Trainer::grad_scaler() { return step_->grad_scaler(); }

std::vector<model::Batch> Trainer::train_batches() {
  // Megatron's pretraining sampler: the global batch is read in chunks of mbs x DP samples and
  // DP rank r takes the r-th micro-batch of each chunk.
  const int64_t gbs = args_.global_batch_size, mbs = args_.micro_batch_size, dp = pg_.dp->size();
  std::vector<model::Batch> mbatches;
  for (int64_t m = 0; m < gbs / (mbs * dp); ++m)
    mbatches.push_back(make_batch(*train_, state_.consumed_train_samples + (m * dp + pg_.dp_rank()) * mbs, mbs));
  return mbatches;
}

IterationResult Trainer::train_step() {
  const double t_start = IterationLog::now_s();
  IterationResult r = step_->step(train_batches(), state_, time_ops_ ? &op_times_ : nullptr);
  train_time_ += IterationLog::now_s() - t_start;
  return r;
}

double Trainer::evaluate(data::SampleSource& source, int64_t& consumed, int64_t iters) {
  ddp_->finish_param_gather();
  const int64_t mbs = args_.micro_batch_size, dp = pg_.dp->size();
  double sums[2] = {0, 0};
  for (int64_t it = 0; it < iters; ++it) {
    std::vector<model::Batch> mbatches;
    for (int64_t m = 0; m < args_.global_batch_size / (mbs * dp); ++m)
      mbatches.push_back(make_batch(source, consumed + (m * dp + pg_.dp_rank()) * mbs, mbs));
    model::PassContext ctx;
    ctx.training = false;
    model::LossSums s = pipeline_->evaluate(mbatches, ctx);
    s.loss_sum += model_->collect_device_loss();
    sums[0] += s.loss_sum;
    sums[1] += s.tokens;
    consumed += args_.global_batch_size;
  }
  pg_.dp->all_reduce(sums, 2);
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

int Trainer::run() {
  MT_CHECK(train_ != nullptr, "training data not set");
  maybe_load();
  const auto& m = args_.model;
  log_info("model: {} layers, hidden {}, {} heads ({} query groups, head dim {}), ffn {}, vocab {} (padded from {}), "
           "seq {}, {} parameters{}{}",
           m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels, m.ffn_hidden_size,
           m.vocab_size, m.orig_vocab_size, m.seq_length, m.num_parameters(),
           m.moe.enabled() ? fmt::format(" ({} active: {} MoE layers of {} experts, top-{})", m.num_active_parameters(),
                                         m.moe.num_moe_layers(m.num_layers), m.moe.num_experts, m.moe.topk)
                           : std::string(),
           m.bf16 ? ", bf16" : (m.fp16 ? ", fp16" : ""));
  log_info("training for {} iterations of {} samples ({} micro-batches of {})", total_iters_, args_.global_batch_size,
           args_.global_batch_size / args_.micro_batch_size, args_.micro_batch_size);
  const bool eval_on = args_.eval_iters > 0 && valid_ != nullptr;
  if (eval_on && args_.eval_at_start && state_.iteration == 0) {
    int64_t consumed = 0;  // the start-of-training evaluation does not move the validation position
    log_->validation("validation", evaluate(*valid_, consumed, args_.eval_iters), state_.iteration);
  }
  // Evaluation and checkpoints are kept out of the iteration time.
  auto timed_apart = [&](auto&& fn) {
    const double t0 = IterationLog::now_s();
    fn();
    log_->exclude(IterationLog::now_s() - t0);
  };
  log_->start(state_);
  while (state_.iteration < total_iters_) {
    IterationResult r = train_step();
    if (saver_->pending()) saver_->poll();  // completes an async save once every rank has written it
    log_->record(r, state_, schedule_->lr(state_.scheduler_samples), step_->grad_scaler());
    const int64_t it = state_.iteration;
    if (eval_on && it % args_.eval_interval == 0 && it < total_iters_)
      timed_apart([&] {
        log_->validation("validation", evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters), it);
      });
    if (!args_.save.empty() && args_.save_interval > 0 && it % args_.save_interval == 0) timed_apart([&] { save(); });
    if (args_.exit_interval > 0 && it % args_.exit_interval == 0) {
      log_info("exiting at iteration {} (--exit-interval {})", it, args_.exit_interval);
      if (!args_.save.empty() && (args_.save_interval == 0 || it % args_.save_interval != 0)) save();
      saver_->wait();
      return 0;
    }
  }
  if (eval_on)
    log_->validation("validation", evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters), state_.iteration);
  if (!args_.save.empty() && (args_.save_interval == 0 || state_.iteration % args_.save_interval != 0)) save();
  saver_->wait();  // exit only after an async save completed
  if (model_->params().device() != Device::CPU) {
    const ops::GpuContext& gpu = ops::gpu_context();
    log_info("peak GPU memory: {:.2f} GiB ({})", static_cast<double>(gpu.peak_memory_bytes()) / (1 << 30), gpu.name());
  }
  if (time_ops_) log_->op_breakdown(op_times_, train_time_);
  return 0;
}

}  // namespace mt
