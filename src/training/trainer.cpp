#include "training/trainer.h"

#include <algorithm>
#include <exception>
#include <random>

#include "core/error.h"
#include "core/log.h"
#include "core/memory_timeline.h"
#include "data/packed_documents.h"
#include "kernels/device.h"
#include "kernels/profiler.h"

namespace mt {

Trainer::Trainer(Arguments args, std::unique_ptr<data::Tokenizer> tokenizer, parallel::ProcessGroups groups)
    : args_(std::move(args)), tokenizer_(std::move(tokenizer)), pg_(std::move(groups)) {
  const int64_t gbs = args_.global_batch_size;
  batch_schedule_ = BatchSchedule(args_);
  total_iters_ = args_.train_iters > 0 ? args_.train_iters : batch_schedule_.iterations_for(args_.train_samples);
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
  time_ops_ = args_.log_op_breakdown;
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
  setup_ops();
  log_->set_fp8(model_->fp8());
  // Delayed scaling's amaxes reduce over data x context parallel too (Megatron's amax group).
  if (model::Fp8Store* f = model_->fp8()) f->set_amax_group(pg_.dp_cp);
}

void Trainer::setup_data_parallel() {
  // MoE experts' gradients reduce over the expert-data-parallel group (parallel/grid.h).
  // Parameters are replicated over context-parallel ranks too: dense gradients reduce over DP x CP.
  ddp_ = std::make_unique<parallel::DataParallel>(pg_.dp_cp, ddp_options(args_), pg_.edp);
}

void Trainer::setup_model() {
  // This rank's pipeline part: its layer chunks, the embedding on the first stage, the head on the last.
  const parallel::PipelineLayout layout(args_.model.num_layers, pipeline_options(args_));
  model::PipelinePart part{layout.chunks(pg_.pp->rank()), pg_.pp->rank() == 0, pg_.pp->rank() == pg_.pp->size() - 1};
  model_ = std::make_unique<model::GPTModel>(
      args_.model, model::ModelOptions{pg_.tp.get(), args_.sequence_parallel, ddp_->layout_fn(), std::move(part),
                                       args_.tp_comm_overlap, {pg_.ep.get(), pg_.etp.get(), pg_.tp_ep.get()},
                                       context_parallel()});
  model::prepare_cp_transfers(context_parallel());
}

model::ContextParallel Trainer::context_parallel() const {
  model::ContextParallel cp{pg_.cp->size() > 1 ? pg_.cp.get() : nullptr, args_.cp_comm_type};
  if (cp.comm_type != "a2a+p2p") return cp;
  // Hierarchical: its two groups, or, where one of them is the whole CP group, the plain form.
  if (pg_.cp_a2a) {
    cp.a2a = pg_.cp_a2a.get();
    cp.ring = pg_.cp_ring.get();
  } else {
    cp.comm_type = args_.cp_a2a_size > 1 ? "a2a" : "p2p";
  }
  return cp;
}

void Trainer::setup_pipeline() {
  pipeline_ = std::make_unique<parallel::PipelineRunner>(*model_, pg_.pp, args_.microbatch_group_size_per_vp_stage);
  ddp_->attach(model_->params());
}

// --device cuda moves the parameters and grads to the GPU (the step runner's optimizer then makes
// its state there); the host keeps the loop. The run picked the device and made its GPU context
// (and set the attention backend) in pretrain.
void Trainer::setup_device() {
  ops::set_nvtx_enabled(args_.nvtx_ranges || args_.profile);
  if (args_.device != "cuda") return;
  ops::gpu_context();  // fails if the run made none
  model_->to_device(Device::CUDA);
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
  so.stop_on_nan = args_.check_for_nan_in_loss_and_grad;
  so.count_zeros = args_.log_num_zeros_in_grad;
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
                                                           : fmt::format("1/{}", pg_.dp_cp->size());
    log_info("distributed optimizer: this rank's optimizer state covers {} of {} elements ({}): {:.2f} MiB instead "
             "of {:.2f} MiB",
             owned, ps.numel(), split, static_cast<double>(owned) * per / 1048576.0,
             static_cast<double>(ps.numel()) * per / 1048576.0);
  }
  if (ddp_->fp8_param_gather() && ddp_->sharded()) {
    // What the flag saves: the FP8 weights' share of the parameter all-gather, per step.
    int64_t fp8 = 0, other = 0;
    for (const parallel::Bucket& k : ddp_->buckets()) (k.fp8 ? fp8 : other) += k.end - k.begin;
    const double mib = 1.0 / 1048576.0;
    log_info("--fp8-param-gather: {} FP8 linear weights' elements are all-gathered as FP8 codes, {:.2f} MiB a step "
             "(a bf16 gather: {:.2f} MiB; this build's fp32 main-value gather: {:.2f} MiB); the other {} elements "
             "keep the fp32 gather",
             fp8, static_cast<double>(fp8) * mib, static_cast<double>(fp8) * 2 * mib,
             static_cast<double>(fp8) * 4 * mib, other);
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

// Megatron's cyclic sampler visits every sample once per epoch in a random order drawn afresh each
// epoch from the epoch number; here the draw is a Fisher-Yates shuffle with an MT19937-64 seeded
// by --seed and the epoch (torch's generator is not reproduced, so the order is not Megatron's).
int64_t Trainer::cyclic_index(int64_t position, int64_t size) const {
  const int64_t epoch = position / size;
  if (epoch != cyclic_epoch_) {
    cyclic_perm_.resize(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i) cyclic_perm_[static_cast<size_t>(i)] = i;
    std::mt19937_64 rng(args_.seed * 1000003ULL + static_cast<uint64_t>(epoch));
    for (int64_t i = size - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(cyclic_perm_[static_cast<size_t>(i)], cyclic_perm_[static_cast<size_t>(j)]);
    }
    cyclic_epoch_ = epoch;
  }
  return cyclic_perm_[static_cast<size_t>(position % size)];
}

model::Batch Trainer::make_batch(data::SampleSource& src, int64_t first, int64_t count, bool cyclic) const {
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
    const int64_t idx = cyclic ? cyclic_index(first + i, src.size()) : (first + i) % src.size();
    src.get(idx, buf.data());
    for (int64_t t = 0; t < S; ++t) {
      size_t o = static_cast<size_t>(i * S + t);
      b.tokens[o] = buf[static_cast<size_t>(t)];
      b.labels[o] = buf[static_cast<size_t>(t + 1)];
      // Megatron masks the loss where the *input* token is EOD when --eod-mask-loss is set.
      if (args_.eod_mask_loss && buf[static_cast<size_t>(t)] == eod) b.loss_mask[o] = 0.f;
    }
  }
  data::mark_documents(b.tokens, count, S, eod, args_.reset_position_ids, args_.reset_attention_mask,
                       b.position_ids, b.cu_seqlens);
  return b;
}

optim::GradScaler* Trainer::grad_scaler() { return step_->grad_scaler(); }

std::vector<model::Batch> Trainer::train_batches(int64_t gbs) {
  // Megatron's pretraining sampler: the global batch is read in chunks of mbs x DP samples and
  // DP rank r takes the r-th micro-batch of each chunk.
  const int64_t mbs = args_.micro_batch_size, dp = pg_.dp->size();
  std::vector<model::Batch> mbatches;
  TimerScope t(timers_.get(), "batch-generator", 2);
  for (int64_t m = 0; m < gbs / (mbs * dp); ++m)
    mbatches.push_back(make_batch(*train_, state_.consumed_train_samples + (m * dp + pg_.dp_rank()) * mbs, mbs,
                                  args_.dataloader_type == "cyclic"));
  return mbatches;
}

IterationResult Trainer::train_step() {
  const double t_start = IterationLog::now_s();
  const int64_t gbs = batch_schedule_.at(state_.consumed_train_samples);
  if (!batch_schedule_.constant()) {
    step_->set_global_batch_size(gbs);
    log_->set_global_batch_size(gbs);
  }
  IterationResult r = step_->step(train_batches(gbs), state_, time_ops_ ? &op_times_ : nullptr);
  const double took = IterationLog::now_s() - t_start;
  train_time_ += took;
  // The op breakdown leaves this process's first step out when more follow: it holds the GEMM
  // autotuning, cuDNN's plan builds and the allocator's growth, which in a short benchmark run
  // could outweigh whole categories (an MoE run's attention share read twice the dense run's).
  if (time_ops_ && iterations_run_ == 0 && state_.iteration < total_iters_) {
    op_times_.reset();
    train_time_ = 0;
    breakdown_skipped_first_ = true;
  }
  interval_step_s_ += took;
  interval_steps_++;
  iterations_run_++;
  return r;
}

double Trainer::evaluate(data::SampleSource& source, int64_t& consumed, int64_t iters) {
  ddp_->prepare_fp8_params();
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
  pg_.dp_cp->all_reduce(sums, 2);  // CP ranks each hold part of every sequence's tokens
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

void Trainer::evaluate_at_end() {
  if (args_.eval_iters == 0) return;
  if (valid_) report_validation(evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters), state_.iteration);
  if (test_) {
    int64_t consumed = 0;  // Megatron evaluates the test set from its start
    log_->validation("test", evaluate(*test_, consumed, args_.eval_iters), state_.iteration);
  }
}

int Trainer::run() {
  MT_CHECK(train_ != nullptr, "training data not set");
  maybe_load();
  if (args_.skip_train) {
    log_info("--skip-train: evaluating at iteration {} without training", state_.iteration);
    evaluate_at_end();
    return 0;
  }
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
    report_validation(evaluate(*valid_, consumed, args_.eval_iters), state_.iteration);
  }
  // Evaluation and checkpoints are kept out of the iteration time.
  auto timed_apart = [&](auto&& fn) {
    const double t0 = IterationLog::now_s();
    fn();
    log_->exclude(IterationLog::now_s() - t0);
  };
  log_->start(state_);
  // Megatron's --profile window: the profiler runs over iterations (start, end] on the listed ranks.
  const bool profiling = args_.profile && std::find(args_.profile_ranks.begin(), args_.profile_ranks.end(),
                                                    std::to_string(pg_.rank)) != args_.profile_ranks.end();
  // The CUDA profiler exists only for a run on the GPU (a CUDA build may run on the CPU, with no driver).
  const bool cuda_profiler = ops::profiler_available() && model_->params().device() == Device::CUDA;
  if (profiling && !cuda_profiler)
    log_info("--profile: this run is on the CPU, so there is no CUDA profiler to start (on the CPU, profile with "
             "perf); training goes on");
  bool profiler_on = false;
  while (state_.iteration < total_iters_) {
    if (profiling && state_.iteration == args_.profile_step_start && cuda_profiler) {
      log_info("--profile: CUDA profiler started before iteration {}", state_.iteration + 1);
      ops::profiler_start();
      profiler_on = true;
    }
    IterationResult r;
    if (memory_timeline::recording()) memory_timeline::set_iteration(state_.iteration + 1);
    {
      // Names each step in a capture (nsys stats, ncu --nvtx), so what was captured shows.
      const ops::NvtxRange range("iteration {}", state_.iteration + 1);
      r = train_step();
    }
    if (profiler_on && state_.iteration == args_.profile_step_end) {
      ops::profiler_stop();
      profiler_on = false;
      log_info("--profile: CUDA profiler stopped after iteration {}", state_.iteration);
    }
    if (saver_->pending()) saver_->poll();  // completes an async save once every rank has written it
    before_log(r);
    log_->record(r, state_, schedule_->lr(state_.scheduler_samples), step_->grad_scaler());
    after_log();
    const int64_t it = state_.iteration;
    if (eval_on && it % args_.eval_interval == 0 && it < total_iters_)
      timed_apart([&] {
        report_validation(evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters), it);
      });
    const bool saved = !args_.save.empty() && args_.save_interval > 0 && it % args_.save_interval == 0;
    if (saved) timed_apart([&] { save(); });
    if (auto why = exit_requested()) {
      // Preemption or the time limit: this iteration's state is what resumes bit-identically.
      log_info("exiting at iteration {}: {}{}", it, *why, args_.save.empty() ? " (no --save: nothing saved)" : "");
      if (!args_.save.empty() && !saved) save();
      saver_->wait();
      return 0;
    }
    if (args_.exit_interval > 0 && it % args_.exit_interval == 0) {
      log_info("exiting at iteration {} (--exit-interval {})", it, args_.exit_interval);
      if (!args_.save.empty() && (args_.save_interval == 0 || it % args_.save_interval != 0)) save();
      saver_->wait();
      return 0;
    }
  }
  evaluate_at_end();
  if (!args_.save.empty() && (args_.save_interval == 0 || state_.iteration % args_.save_interval != 0)) save();
  saver_->wait();  // exit only after an async save completed
  if (model_->params().device() != Device::CPU) {
    const ops::GpuContext& gpu = ops::gpu_context();
    // Tensors (what `megatron estimate` calls the tensor pool peak), then with kernel workspaces.
    log_info("peak GPU memory: {:.2f} GiB ({}); with kernel workspaces: {:.2f} GiB",
             static_cast<double>(gpu.peak_memory_bytes()) / (1 << 30), gpu.name(),
             static_cast<double>(gpu.peak_memory_with_scratch_bytes()) / (1 << 30));
  }
  if (time_ops_) {
    if (breakdown_skipped_first_) log_info("op breakdown: the steps after this process's first (its warm-up left out)");
    log_->op_breakdown(op_times_, train_time_);
  }
  return 0;
}

}  // namespace mt
