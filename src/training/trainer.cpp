#include "training/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>

#include "core/error.h"
#include "core/log.h"
#include "training/flops.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/device.h"
#endif

namespace mt {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

nlohmann::json model_args_to_json(const Arguments& a) {
  const auto& m = a.model;
  return {{"num_layers", m.num_layers},
          {"hidden_size", m.hidden_size},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"num_attention_heads", m.num_attention_heads},
          {"num_query_groups", m.num_query_groups},
          {"kv_channels", m.kv_channels},
          {"seq_length", m.seq_length},
          {"max_position_embeddings", m.max_position_embeddings},
          {"vocab_size", m.vocab_size},
          {"orig_vocab_size", m.orig_vocab_size},
          {"normalization", m.normalization},
          {"norm_epsilon", m.norm_epsilon},
          {"swiglu", m.swiglu},
          {"openai_gelu", m.openai_gelu},
          {"position_embedding_type", m.position_embedding_type},
          {"rotary_base", m.rotary_base},
          {"rotary_percent", m.rotary_percent},
          {"rope_scaling", m.rope_scaling},
          {"rope_scaling_factor", m.rope_scaling_factor},
          {"rope_low_freq_factor", m.rope_low_freq_factor},
          {"rope_high_freq_factor", m.rope_high_freq_factor},
          {"rope_original_max_position", m.rope_original_max_position},
          {"qk_layernorm", m.qk_layernorm},
          {"add_bias_linear", m.add_bias_linear},
          {"add_qkv_bias", m.add_qkv_bias},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
          {"bf16", m.bf16},
          {"fp16", m.fp16},
          {"tokenizer_type", a.tokenizer.type},
          {"vocab_file", a.tokenizer.vocab_file},
          {"merge_file", a.tokenizer.merge_file},
          {"tokenizer_model", a.tokenizer.tokenizer_model},
          {"tokenizer_vocab_size", a.tokenizer.vocab_size}};
}

void model_args_from_json(const nlohmann::json& j, Arguments& a) {
  auto& m = a.model;
  try {
    m.num_layers = j.at("num_layers");
    m.hidden_size = j.at("hidden_size");
    m.ffn_hidden_size = j.at("ffn_hidden_size");
    m.num_attention_heads = j.at("num_attention_heads");
    m.num_query_groups = j.at("num_query_groups");
    m.kv_channels = j.at("kv_channels");
    m.seq_length = j.at("seq_length");
    m.max_position_embeddings = j.at("max_position_embeddings");
    m.vocab_size = j.at("vocab_size");
    m.orig_vocab_size = j.at("orig_vocab_size");
    m.normalization = j.at("normalization");
    m.norm_epsilon = j.at("norm_epsilon");
    m.swiglu = j.at("swiglu");
    m.openai_gelu = j.at("openai_gelu");
    m.position_embedding_type = j.at("position_embedding_type");
    m.rotary_base = j.at("rotary_base");
    m.rotary_percent = j.at("rotary_percent");
    // Added later: older checkpoints lack them and had neither feature.
    m.rope_scaling = j.value("rope_scaling", false);
    m.rope_scaling_factor = j.value("rope_scaling_factor", 8.0);
    m.rope_low_freq_factor = j.value("rope_low_freq_factor", 1.0);
    m.rope_high_freq_factor = j.value("rope_high_freq_factor", 4.0);
    m.rope_original_max_position = j.value("rope_original_max_position", int64_t{8192});
    m.qk_layernorm = j.value("qk_layernorm", false);
    m.add_bias_linear = j.at("add_bias_linear");
    m.add_qkv_bias = j.at("add_qkv_bias");
    m.untie_embeddings_and_output_weights = j.at("untie_embeddings_and_output_weights");
    m.bf16 = j.at("bf16");
    m.fp16 = j.value("fp16", false);  // added later: older checkpoints are bf16 or fp32
    a.tokenizer.type = j.at("tokenizer_type");
    a.tokenizer.vocab_file = j.at("vocab_file");
    a.tokenizer.merge_file = j.at("merge_file");
    a.tokenizer.tokenizer_model = j.at("tokenizer_model");
    a.tokenizer.vocab_size = j.at("tokenizer_vocab_size");
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint state.json lacks model arguments: {}", e.what());
  }
}

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
  // Megatron seeds each pipeline stage's dropout with seed + 100 x stage, so stages that draw
  // the same offsets still get different masks.
  const uint64_t stage_seed = args_.seed + 100 * static_cast<uint64_t>(pg_.pp->rank());
  dropout_rng_ = RngState{stage_seed, 0};
  tp_rng_ = RngState{stage_seed + 2718 + static_cast<uint64_t>(pg_.tp_rank()), 0};
  log_rank_ = pg_.grid.rank(parallel::Coord{{0, 0, 0, 0, pg_.grid.pp() - 1}});
  parallel::DDPOptions dd;
  dd.overlap_grad_reduce = args_.overlap_grad_reduce;
  dd.use_distributed_optimizer = args_.use_distributed_optimizer;
  dd.overlap_param_gather = args_.overlap_param_gather;
  dd.bucket_size = args_.ddp_bucket_size;
  ddp_ = std::make_unique<parallel::DataParallel>(pg_.dp, dd);
  // This rank's pipeline part: its layer chunks, the embedding on the first stage, the head on the last.
  const parallel::PipelineLayout layout(args_.model.num_layers, pipeline_options(args_));
  model::PipelinePart part{layout.chunks(pg_.pp->rank()), pg_.pp->rank() == 0, pg_.pp->rank() == pg_.pp->size() - 1};
  model_ = std::make_unique<model::GPTModel>(
      args_.model, model::ModelOptions{pg_.tp.get(), args_.sequence_parallel, ddp_->layout_fn(), std::move(part),
                                       args_.tp_comm_overlap});
  pipeline_ = std::make_unique<parallel::PipelineRunner>(*model_, pg_.pp, args_.microbatch_group_size_per_vp_stage);
  auto& ps = model_->params();
  ddp_->attach(ps);
  saver_ = std::make_unique<checkpoint::Saver>(rank_info());
  args_.optimizer.weight_decay = static_cast<float>(args_.start_weight_decay);
  if (args_.device != "cuda") optimizer_ = ddp_->make_optimizer(args_.optimizer);
#ifdef MT_HAVE_CUDA
  if (args_.device == "cuda") {
    // Parameters, grads and AdamW state live on the device; the host keeps the loop.
    if (args_.optimizer.type != "adam") fail("--device cuda supports --optimizer adam only for now");
    ops::gpu_context();  // made where the run picked its device (pretrain): fails if it did not
    cuda::set_attention_backend(cuda::attention_backend_from_name(args_.attention_backend));
    cuda::set_attention_deterministic(!args_.nondeterministic_attention);
    model_->to_device(Device::CUDA);
    time_ops_ = args_.timing_log_level >= 1;
    if (time_ops_) op_times_.set_device(Device::CUDA);
    for (auto [lo, hi] : optimizer_ranges())
      gpu_adam_.push_back({lo, hi,
                           std::make_unique<ops::gpu::AdamW>(hi - lo, parallel::spans_within(ps.spans(), lo, hi),
                                                             args_.optimizer.adam_beta1, args_.optimizer.adam_beta2,
                                                             args_.optimizer.adam_eps, ps.model_buffer().dtype())});
  }
#endif
  if (ddp_->sharded()) {
    int64_t owned = 0;
    for (auto [lo, hi] : ddp_->owned_ranges()) owned += hi - lo;
    const double per = args_.optimizer.type == "adam" ? 8.0 : 4.0;  // fp32 moments per element
    log_info("distributed optimizer: this rank's optimizer state covers {} of {} elements (1/{}): {:.2f} MiB instead "
             "of {:.2f} MiB",
             owned, ps.numel(), pg_.dp->size(), static_cast<double>(owned) * per / 1048576.0,
             static_cast<double>(ps.numel()) * per / 1048576.0);
  }

  optim::LRScheduleConfig lc;
  lc.max_lr = args_.optimizer.lr;
  lc.min_lr = args_.min_lr;
  lc.decay_style = args_.lr_decay_style;
  lc.lr_warmup_init = args_.lr_warmup_init;
  lc.wsd_decay_style = args_.lr_wsd_decay_style;
  lc.start_wd = args_.start_weight_decay;
  lc.end_wd = args_.end_weight_decay;
  lc.wd_incr_style = args_.weight_decay_incr_style;
  if (args_.train_iters > 0) {  // iteration-based: Megatron converts to samples
    int64_t decay_iters = args_.lr_decay_iters > 0 ? args_.lr_decay_iters : args_.train_iters;
    lc.decay_steps = decay_iters * gbs;
    lc.warmup_steps = args_.lr_warmup_fraction >= 0
                          ? static_cast<int64_t>(args_.lr_warmup_fraction * static_cast<double>(lc.decay_steps))
                          : args_.lr_warmup_iters * gbs;
    lc.wsd_decay_steps = args_.lr_wsd_decay_iters * gbs;
    lc.wd_incr_steps = args_.train_iters * gbs;
  } else {
    lc.decay_steps = args_.lr_decay_samples > 0 ? args_.lr_decay_samples : args_.train_samples;
    lc.warmup_steps = args_.lr_warmup_fraction >= 0
                          ? static_cast<int64_t>(args_.lr_warmup_fraction * static_cast<double>(lc.decay_steps))
                          : args_.lr_warmup_samples;
    lc.wsd_decay_steps = args_.lr_wsd_decay_samples;
    lc.wd_incr_steps = args_.train_samples;
  }
  schedule_ = std::make_unique<optim::LRSchedule>(lc);
}

optim::Optimizer& Trainer::host_optimizer() {
  if (!optimizer_) optimizer_ = ddp_->make_optimizer(args_.optimizer);
  return *optimizer_;
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

optim::GradScaler* Trainer::grad_scaler() {
  if (!args_.model.fp16) return nullptr;
  if (!grad_scaler_) grad_scaler_ = std::make_unique<optim::GradScaler>(args_.grad_scaler);
  return grad_scaler_.get();
}

IterationResult Trainer::train_step() {
  const double t_start = now_s();
  model::OpTimes* times = time_ops_ ? &op_times_ : nullptr;
  const int64_t gbs = args_.global_batch_size, mbs = args_.micro_batch_size, dp = pg_.dp->size();
  const int64_t nmb = gbs / (mbs * dp);
  // Megatron's pretraining sampler: the global batch is read in chunks of mbs x DP samples and
  // DP rank r takes the r-th micro-batch of each chunk.
  std::vector<model::Batch> mbatches;
  double total_tokens = 0;
  for (int64_t m = 0; m < nmb; ++m) {
    mbatches.push_back(make_batch(*train_, state_.consumed_train_samples + (m * dp + pg_.dp_rank()) * mbs, mbs));
    for (float x : mbatches.back().loss_mask) total_tokens += x;
  }
  total_tokens = pg_.dp->all_reduce_value(total_tokens);
  auto& ps = model_->params();
  ps.zero_grad();
  ddp_->start_iteration();
  IterationResult r;
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
  // Every stage reads the micro-batches (tokens on the first, labels on the last, the token
  // count everywhere); the schedule interleaves their passes (F0 B0 F1 B1 ... without PP).
  model::LossSums ls = pipeline_->train(mbatches, scaler ? scale * scaler->scale() : scale, ctx, ddp_.get());
  // Gradients no weight GEMM wrote this step: zero_grad left them for their first write.
  ps.zero_unwritten_grads();
  ls.loss_sum += model_->collect_device_loss();  // on the GPU the sum stays on the device until here
  if (pg_.pp->size() > 1) {
    // A stage draws dropout offsets for its own layers only: move every stage's streams to the
    // furthest position, so they advance alike on all ranks and one saved offset resumes any.
    int64_t off[2] = {static_cast<int64_t>(dropout_rng_.offset), static_cast<int64_t>(tp_rng_.offset)};
    pg_.pp->all_reduce(off, 2, comm::ReduceOp::Max);
    dropout_rng_.offset = static_cast<uint64_t>(off[0]);
    tp_rng_.offset = static_cast<uint64_t>(off[1]);
  }
  {
    // The part of the gradient reduction that backward did not hide.
    model::ScopedOpTimer t(times, &model::OpTimes::communication);
    ddp_->finish_grad_sync();
    parallel::all_reduce_embedding_grads(ps, *pg_.embedding);
    parallel::all_reduce_sequence_parallel_grads(ps, *pg_.tp);
  }
  // The loss is on the last stage: summed over DP, then over PP (zeros elsewhere), so every
  // rank has the global value and takes the same NaN/skip decision.
  double sums[2] = {ls.loss_sum, ls.tokens};
  pg_.dp->all_reduce(sums, 2);
  if (pg_.pp->size() > 1) pg_.pp->all_reduce(sums, 2);
  r.loss_sum = sums[0];
  r.tokens = sums[1];
  float* grads = ps.grad_buffer().data<float>();
  bool found_inf = false;
  if (scaler) {
    // Megatron's fp16 optimizer: unscale the grads this rank steps on (its owned slices with the
    // distributed optimizer), look for inf/nan, and agree over the model- and data-parallel
    // ranks, so every rank skips or steps alike; the scaler backs off or grows from the verdict.
    const float inv = scaler->inv_scale();
    int64_t found = 0;
#ifdef MT_HAVE_CUDA
    if (ps.grad_buffer().device() == Device::CUDA)
      found = ops::gpu::unscale_and_check(grads, optimizer_ranges(), inv) ? 1 : 0;  // one device flag, read once
    else
#endif
      for (auto [lo, hi] : optimizer_ranges()) found |= optim::unscale_and_check(grads + lo, hi - lo, inv) ? 1 : 0;
    pg_.mp->all_reduce(&found, 1, comm::ReduceOp::Max);
    pg_.dp->all_reduce(&found, 1, comm::ReduceOp::Max);
    found_inf = found != 0;
    scaler->update(found_inf);
  }
  // Skipped for an overflow, the norm is not computed (Megatron's None; NaN here, left out of
  // the log line).
  r.grad_norm = found_inf ? std::numeric_limits<double>::quiet_NaN()
                          : parallel::global_grad_norm(ps, ddp_->owned_ranges(), pg_.tp_rank(), *pg_.mp,
                                                       ddp_->sharded() ? pg_.dp.get() : nullptr);
  const double loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0.0;
  if (found_inf) {
    // An fp16 overflow: expected while the dynamic scale settles. Skipped and counted as
    // Megatron does (a nan iteration only when the loss itself is not finite).
    r.skipped = true;
    state_.skipped_iterations++;
    if (!std::isfinite(loss)) state_.nan_iterations++;
    log_debug("iteration {}: inf/nan in the fp16 gradients - update skipped, loss scale now {}", state_.iteration + 1,
              scaler->scale());
  } else if (!std::isfinite(loss) || !std::isfinite(r.grad_norm)) {
    // Never continue silently on NaN/Inf: skip the update and report it with the iteration.
    r.skipped = true;
    state_.nan_iterations++;
    state_.skipped_iterations++;
    log_warn("iteration {}: {} is {} - update skipped", state_.iteration + 1,
             std::isfinite(loss) ? "grad norm" : "loss", std::isfinite(loss) ? r.grad_norm : loss);
  } else {
    model::ScopedOpTimer t(times, &model::OpTimes::optimizer);
    const int64_t steps = state_.scheduler_samples;  // the scheduler counts samples of updates
#ifdef MT_HAVE_CUDA
    if (!gpu_adam_.empty()) {
      if (args_.clip_grad > 0) ops::gpu::clip_grads(grads, ps.numel(), r.grad_norm, args_.clip_grad);
      // The update also writes the bf16 (fp16) compute copy of the owned ranges: no separate sync pass.
      float* main = ps.main_buffer().data<float>();
      uint16_t* model16 = ps.model_buffer().data<uint16_t>();
      for (auto& part : gpu_adam_)
        part.opt->step(main + part.lo, grads + part.lo, model16 + part.lo, schedule_->lr(steps),
                       schedule_->weight_decay(steps));
      if (ddp_->sharded()) ddp_->start_param_gather();  // the other ranks' slices
      state_.optimizer_steps = gpu_adam_.front().opt->step_count();
    } else
#endif
    {
      if (args_.clip_grad > 0) optim::clip_grads(grads, ps.numel(), r.grad_norm, args_.clip_grad);
      optimizer_->step(ps.main_buffer().data<float>(), grads, static_cast<float>(schedule_->lr(steps)),
                       static_cast<float>(schedule_->weight_decay(steps)));
      if (ddp_->sharded()) ddp_->start_param_gather();  // refreshes the compute copy per bucket
      else ps.sync_model_from_main();
      state_.optimizer_steps = optimizer_->step_count();
    }
  }
  state_.iteration++;
  state_.consumed_train_samples += gbs;
  if (!r.skipped) state_.scheduler_samples += gbs;
  last_lr_ = schedule_->lr(state_.scheduler_samples);
  train_time_ += now_s() - t_start;
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

nlohmann::json Trainer::model_args_json() const { return model_args_to_json(args_); }

void Trainer::log_iteration(double elapsed_s, double loss, double grad_norm, int64_t tokens) {
  const int64_t n = std::max<int64_t>(interval_iters_, 1);
  const double ms = elapsed_s / static_cast<double>(n) * 1000.0;
  const double tflops = flops_per_iteration(args_.model, args_.global_batch_size, args_.model.seq_length) /
                        (elapsed_s / static_cast<double>(n)) / 1e12 / static_cast<double>(pg_.grid.world());
  const double tok_s = static_cast<double>(tokens) / elapsed_s;
  std::string line = fmt::format(
      " iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | "
      "throughput per GPU (TFLOP/s/GPU): {:.3f} | tokens per second: {:.0f}{} | learning rate: {:.6E} | "
      "global batch size: {:5d} | lm loss: {:.6E} | loss scale: {:.1f} |{} "
      "number of skipped iterations: {:3d} | number of nan iterations: {:3d} |",
      state_.iteration, total_iters_, state_.consumed_train_samples, ms, tflops, tok_s,
      args_.device == "cuda" ? fmt::format(" | MFU: {:.1f}%", 100.0 * tflops / 989.0) : std::string(), last_lr_,
      args_.global_batch_size, loss, grad_scaler_ ? static_cast<double>(grad_scaler_->scale()) : 1.0,
      // A step skipped for an fp16 overflow has no grad norm: Megatron leaves the field out.
      std::isnan(grad_norm) && grad_scaler_ ? std::string() : fmt::format(" grad norm: {:.3f} |", grad_norm),
      state_.skipped_iterations - logged_skipped_, state_.nan_iterations - logged_nan_);
  // Megatron counts skipped and nan iterations per log interval (the totals go in checkpoints).
  logged_skipped_ = state_.skipped_iterations;
  logged_nan_ = state_.nan_iterations;
  print_log_line(line);
}

void Trainer::print_log_line(const std::string& text) const {
  // Megatron's print_rank_last: these lines come from a rank that holds the loss, the first
  // rank of the last pipeline stage (rank 0 without PP); other messages come from rank 0.
  if (pg_.rank != log_rank_ || log_level() > LogLevel::Info) return;
  if (args_.log_progress_bar && isatty(STDOUT_FILENO)) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void Trainer::print_validation(const char* set, double loss) {
  std::string body = fmt::format(" validation loss at iteration {} on {} set | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ",
                                 state_.iteration, set, loss, std::exp(std::min(20.0, loss)));
  std::string dash(body.size() + 1, '-');
  print_log_line(fmt::format("{}\n{}\n{}", dash, body, dash));
}

void Trainer::log_op_breakdown() {
  std::vector<double> mine = model::category_seconds(op_times_);
  const comm::CommPtr& pp = pg_.pp;
  if (!pp || pp->size() == 1) {
    print_log_line(model::format_op_breakdown(mine, train_time_));
    return;
  }
  // Every stage's own line (stages do different work: embedding, output layer and loss, and
  // idle bubble time that shows up as "other"), gathered over the pipeline group.
  mine.push_back(train_time_);
  const size_t n = mine.size();
  std::vector<double> all(n * static_cast<size_t>(pp->size()));
  pp->all_gather(mine.data(), all.data(), n, comm::DataType::F64);
  for (int s = 0; s < pp->size(); ++s) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(s));
    print_log_line(fmt::format("pipeline stage {}: {}", s,
                               model::format_op_breakdown(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(n - 1)),
                                                          *(first + static_cast<std::ptrdiff_t>(n - 1)))));
  }
}

int Trainer::run() {
  MT_CHECK(train_ != nullptr, "training data not set");
  maybe_load();
  const auto& m = args_.model;
  log_info("model: {} layers, hidden {}, {} heads ({} query groups, head dim {}), ffn {}, vocab {} (padded from {}), "
           "seq {}, {} parameters{}",
           m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels, m.ffn_hidden_size,
           m.vocab_size, m.orig_vocab_size, m.seq_length, m.num_parameters(),
           m.bf16 ? ", bf16" : (m.fp16 ? ", fp16" : ""));
  log_info("training for {} iterations of {} samples ({} micro-batches of {})", total_iters_, args_.global_batch_size,
           args_.global_batch_size / args_.micro_batch_size, args_.micro_batch_size);
  logged_skipped_ = state_.skipped_iterations;
  logged_nan_ = state_.nan_iterations;
  const bool eval_on = args_.eval_iters > 0 && valid_ != nullptr;
  if (eval_on && args_.eval_at_start && state_.iteration == 0) {
    int64_t consumed = 0;  // the start-of-training evaluation does not move the validation position
    print_validation("validation", evaluate(*valid_, consumed, args_.eval_iters));
  }
  const bool bar = args_.log_progress_bar && isatty(STDOUT_FILENO) && pg_.rank == log_rank_;
  double t_interval = now_s();
  while (state_.iteration < total_iters_) {
    IterationResult r = train_step();
    if (saver_->pending()) saver_->poll();  // completes an async save once every rank has written it
    interval_iters_++;
    if (!r.skipped) {
      interval_loss_sum_ += r.loss_sum;
      interval_tokens_ += r.tokens;
    }
    interval_tokens_count_ += args_.global_batch_size * args_.model.seq_length;
    const int64_t it = state_.iteration;
    if (it % args_.log_interval == 0) {
      double elapsed = now_s() - t_interval;
      log_iteration(elapsed, interval_tokens_ > 0 ? interval_loss_sum_ / interval_tokens_ : 0.0, r.grad_norm,
                    interval_tokens_count_);
      interval_iters_ = 0;
      interval_loss_sum_ = interval_tokens_ = 0;
      interval_tokens_count_ = 0;
      t_interval = now_s();
    } else if (bar) {
      int64_t done = it % args_.log_interval, width = 30;
      int64_t fill = done * width / args_.log_interval;
      std::printf("\r iteration %ld/%ld [%s%s]", static_cast<long>(it), static_cast<long>(total_iters_),
                  std::string(static_cast<size_t>(fill), '#').c_str(),
                  std::string(static_cast<size_t>(width - fill), ' ').c_str());
      std::fflush(stdout);
    }
    if (eval_on && it % args_.eval_interval == 0 && it < total_iters_) {
      double t0 = now_s();
      print_validation("validation", evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters));
      t_interval += now_s() - t0;  // keep evaluation out of the iteration time
    }
    if (!args_.save.empty() && args_.save_interval > 0 && it % args_.save_interval == 0) {
      double t0 = now_s();
      save();
      t_interval += now_s() - t0;
    }
    if (args_.exit_interval > 0 && it % args_.exit_interval == 0) {
      log_info("exiting at iteration {} (--exit-interval {})", it, args_.exit_interval);
      if (!args_.save.empty() && (args_.save_interval == 0 || it % args_.save_interval != 0)) save();
      saver_->wait();
      return 0;
    }
  }
  if (eval_on) print_validation("validation", evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters));
  if (!args_.save.empty() && (args_.save_interval == 0 || state_.iteration % args_.save_interval != 0)) save();
  saver_->wait();  // exit only after an async save completed
#ifdef MT_HAVE_CUDA
  if (!gpu_adam_.empty())
    log_info("peak GPU memory: {:.2f} GiB ({})",
             static_cast<double>(ops::gpu_context().peak_memory_bytes()) / (1 << 30), ops::gpu_context().name());
#endif
  if (time_ops_) log_op_breakdown();
  return 0;
}

}  // namespace mt
