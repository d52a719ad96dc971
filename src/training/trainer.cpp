#include "training/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "training/flops.h"

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
          {"add_bias_linear", m.add_bias_linear},
          {"add_qkv_bias", m.add_qkv_bias},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
          {"bf16", m.bf16},
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
    m.add_bias_linear = j.at("add_bias_linear");
    m.add_qkv_bias = j.at("add_qkv_bias");
    m.untie_embeddings_and_output_weights = j.at("untie_embeddings_and_output_weights");
    m.bf16 = j.at("bf16");
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
  if (pg_.tp->size() > 1 && (!args_.save.empty() || !args_.load.empty()))
    fail("--save/--load with --tensor-model-parallel-size > 1 need sharded checkpoints, which are not implemented "
         "yet; train without --save/--load or with TP 1");
  dropout_rng_ = RngState{args_.seed, 0};
  tp_rng_ = RngState{args_.seed + 2718 + static_cast<uint64_t>(pg_.tp_rank()), 0};
  parallel::DDPOptions dd;
  dd.overlap_grad_reduce = args_.overlap_grad_reduce;
  dd.use_distributed_optimizer = args_.use_distributed_optimizer;
  dd.overlap_param_gather = args_.overlap_param_gather;
  dd.bucket_size = args_.ddp_bucket_size;
  ddp_ = std::make_unique<parallel::DataParallel>(pg_.dp, dd);
  model_ = std::make_unique<model::GPTModel>(
      args_.model, model::ModelOptions{pg_.tp.get(), args_.sequence_parallel, ddp_->layout_fn()});
  auto& ps = model_->params();
  ddp_->attach(ps);
  args_.optimizer.weight_decay = static_cast<float>(args_.start_weight_decay);
  optimizer_ = ddp_->make_optimizer(args_.optimizer);
  if (ddp_->sharded()) {
    if (!args_.save.empty() && !args_.no_save_optim)
      fail("saving the distributed optimizer's sharded state is not implemented yet; add --no-save-optim (weights "
           "are saved) or drop --use-distributed-optimizer");
    if (!args_.load.empty() && !args_.no_load_optim && !args_.finetune)
      fail("loading optimizer state into the distributed optimizer is not implemented yet; add --no-load-optim "
           "(weights are loaded) or drop --use-distributed-optimizer");
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

IterationResult Trainer::train_step() {
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
  for (size_t m = 0; m < mbatches.size(); ++m) {
    model::PassContext ctx;
    ctx.training = true;
    ctx.rng = &dropout_rng_;
    ctx.tp_rng = pg_.tp->size() > 1 ? &tp_rng_ : nullptr;
    ctx.times = &op_times_;
    ddp_->set_last_microbatch(m + 1 == mbatches.size());
    ctx.hooks = ddp_->needs_hooks() ? ddp_.get() : nullptr;
    model::GPTModel::Saved saved;
    auto sums = model_->forward(mbatches[m], saved, ctx);
    r.loss_sum += sums.loss_sum;
    r.tokens += sums.tokens;
    model_->backward(saved, scale, ctx);
  }
  ddp_->finish_grad_sync();
  parallel::all_reduce_sequence_parallel_grads(ps, *pg_.tp);
  double sums[2] = {r.loss_sum, r.tokens};
  pg_.dp->all_reduce(sums, 2);
  r.loss_sum = sums[0];
  r.tokens = sums[1];
  float* grads = ps.grad_buffer().data<float>();
  r.grad_norm = parallel::global_grad_norm(ps, ddp_->owned_ranges(), pg_.tp_rank(), *pg_.mp,
                                           ddp_->sharded() ? pg_.dp.get() : nullptr);
  const double loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0.0;
  if (!std::isfinite(loss) || !std::isfinite(r.grad_norm)) {
    // Never continue silently on NaN/Inf: skip the update and report it with the iteration.
    r.skipped = true;
    state_.nan_iterations++;
    state_.skipped_iterations++;
    log_warn("iteration {}: {} is {} - update skipped", state_.iteration + 1,
             std::isfinite(loss) ? "grad norm" : "loss", std::isfinite(loss) ? r.grad_norm : loss);
  } else {
    if (args_.clip_grad > 0) optim::clip_grads(grads, ps.numel(), r.grad_norm, args_.clip_grad);
    const int64_t steps = state_.consumed_train_samples;  // the scheduler counts samples
    optimizer_->step(ps.main_buffer().data<float>(), grads, static_cast<float>(schedule_->lr(steps)),
                     static_cast<float>(schedule_->weight_decay(steps)));
    if (ddp_->sharded()) ddp_->start_param_gather();  // refreshes the compute copy per bucket
    else ps.sync_model_from_main();
    state_.optimizer_steps = optimizer_->step_count();
  }
  state_.iteration++;
  state_.consumed_train_samples += gbs;
  last_lr_ = schedule_->lr(state_.consumed_train_samples);
  return r;
}

double Trainer::evaluate(data::SampleSource& source, int64_t& consumed, int64_t iters) {
  ddp_->finish_param_gather();
  const int64_t mbs = args_.micro_batch_size, dp = pg_.dp->size();
  double sums[2] = {0, 0};
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t m = 0; m < args_.global_batch_size / (mbs * dp); ++m) {
      model::Batch b = make_batch(source, consumed + (m * dp + pg_.dp_rank()) * mbs, mbs);
      model::PassContext ctx;
      ctx.training = false;
      model::GPTModel::Saved saved;
      auto s = model_->forward(b, saved, ctx);
      sums[0] += s.loss_sum;
      sums[1] += s.tokens;
    }
    consumed += args_.global_batch_size;
  }
  pg_.dp->all_reduce(sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

nlohmann::json Trainer::model_args_json() const { return model_args_to_json(args_); }

void Trainer::save() {
  state_.has_rng = !args_.no_save_rng;
  state_.rng_seed = dropout_rng_.seed;
  state_.rng_offset = dropout_rng_.offset;
  state_.args = model_args_json();
  ddp_->finish_param_gather();
  // Without TP every rank holds the same weights: rank 0 writes, the others wait for it.
  if (pg_.rank != 0) {
    pg_.world->barrier();
    return;
  }
  double t0 = now_s();
  checkpoint::save_checkpoint(args_.save, state_, model_->params(), args_.no_save_optim ? nullptr : optimizer_.get());
  log_info("saved checkpoint at iteration {:7d} to {} in {:.2f} s", state_.iteration, args_.save, now_s() - t0);
  pg_.world->barrier();
}

void Trainer::maybe_load() {
  if (args_.load.empty()) return;
  auto it = checkpoint::latest_iteration(args_.load);
  if (!it) {
    log_warn("--load {}: no latest_checkpointed_iteration.txt, training from scratch", args_.load);
    return;
  }
  checkpoint::LoadOptions o;
  o.load_optim = !args_.no_load_optim && !args_.finetune;
  o.load_rng = !args_.no_load_rng && !args_.finetune;
  auto st = checkpoint::load_checkpoint(args_.load, *it, model_->params(), o.load_optim ? optimizer_.get() : nullptr, o);
  if (args_.finetune) {
    log_info("loaded weights from {} iteration {} (--finetune: starting at iteration 0)", args_.load, *it);
    return;
  }
  state_.iteration = st.iteration;
  state_.consumed_train_samples = st.consumed_train_samples;
  state_.consumed_valid_samples = st.consumed_valid_samples;
  state_.optimizer_steps = st.optimizer_steps;
  state_.skipped_iterations = st.skipped_iterations;
  state_.nan_iterations = st.nan_iterations;
  if (o.load_rng && st.has_rng) dropout_rng_ = RngState{st.rng_seed, st.rng_offset};
  log_info("loaded checkpoint from {} at iteration {}", args_.load, *it);
}

void Trainer::log_iteration(double elapsed_s, double loss, double grad_norm, int64_t tokens) {
  const int64_t n = std::max<int64_t>(interval_iters_, 1);
  const double ms = elapsed_s / static_cast<double>(n) * 1000.0;
  const double tflops = flops_per_iteration(args_.model, args_.global_batch_size, args_.model.seq_length) /
                        (elapsed_s / static_cast<double>(n)) / 1e12 / static_cast<double>(pg_.grid.world());
  const double tok_s = static_cast<double>(tokens) / elapsed_s;
  std::string line = fmt::format(
      " iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | "
      "throughput per GPU (TFLOP/s/GPU): {:.3f} | tokens per second: {:.0f} | learning rate: {:.6E} | "
      "global batch size: {:5d} | lm loss: {:.6E} | loss scale: 1.0 | grad norm: {:.3f} | "
      "number of skipped iterations: {:3d} | number of nan iterations: {:3d} |",
      state_.iteration, total_iters_, state_.consumed_train_samples, ms, tflops, tok_s, last_lr_,
      args_.global_batch_size, loss, grad_norm, state_.skipped_iterations, state_.nan_iterations);
  if (args_.log_progress_bar && isatty(STDOUT_FILENO)) std::printf("\r\033[K");
  log_info("{}", line);
}

void Trainer::print_validation(const char* set, double loss) {
  std::string body = fmt::format(" validation loss at iteration {} on {} set | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ",
                                 state_.iteration, set, loss, std::exp(std::min(20.0, loss)));
  std::string dash(body.size() + 1, '-');
  if (args_.log_progress_bar && isatty(STDOUT_FILENO)) std::printf("\r\033[K");
  log_info("{}\n{}\n{}", dash, body, dash);
}

int Trainer::run() {
  MT_CHECK(train_ != nullptr, "training data not set");
  maybe_load();
  const auto& m = args_.model;
  log_info("model: {} layers, hidden {}, {} heads ({} query groups, head dim {}), ffn {}, vocab {} (padded from {}), "
           "seq {}, {} parameters{}",
           m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels, m.ffn_hidden_size,
           m.vocab_size, m.orig_vocab_size, m.seq_length, m.num_parameters(), m.bf16 ? ", bf16" : "");
  log_info("training for {} iterations of {} samples ({} micro-batches of {})", total_iters_, args_.global_batch_size,
           args_.global_batch_size / args_.micro_batch_size, args_.micro_batch_size);
  const bool eval_on = args_.eval_iters > 0 && valid_ != nullptr;
  if (eval_on && args_.eval_at_start && state_.iteration == 0) {
    int64_t consumed = 0;  // the start-of-training evaluation does not move the validation position
    print_validation("validation", evaluate(*valid_, consumed, args_.eval_iters));
  }
  const bool bar = args_.log_progress_bar && isatty(STDOUT_FILENO) && pg_.rank == 0;
  double t_interval = now_s();
  while (state_.iteration < total_iters_) {
    IterationResult r = train_step();
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
      return 0;
    }
  }
  if (eval_on) print_validation("validation", evaluate(*valid_, state_.consumed_valid_samples, args_.eval_iters));
  if (!args_.save.empty() && (args_.save_interval == 0 || state_.iteration % args_.save_interval != 0)) save();
  const double total = op_times_.gemm + op_times_.attention + op_times_.norm + op_times_.elementwise + op_times_.loss;
  if (total > 0)
    log_info("time in ops: GEMM {:.1f}% | attention {:.1f}% | norms {:.1f}% | elementwise {:.1f}% | loss {:.1f}%",
             100 * op_times_.gemm / total, 100 * op_times_.attention / total, 100 * op_times_.norm / total,
             100 * op_times_.elementwise / total, 100 * op_times_.loss / total);
  return 0;
}

}  // namespace mt
