#include "training/iteration_log.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/log.h"
#include "training/flops.h"

namespace mt {

double IterationLog::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

IterationLog::IterationLog(IterationLogOptions o, const model::TransformerConfig& model,
                           const parallel::ProcessGroups& pg)
    : opt_(o), model_(model), pg_(pg) {
  log_rank_ = pg_.grid.rank(parallel::Coord{{0, 0, 0, 0, pg_.grid.pp() - 1}});
  bar_ = opt_.progress_bar && isatty(STDOUT_FILENO) && pg_.rank == log_rank_;
}

void IterationLog::start(const checkpoint::TrainingState& state) {
  logged_skipped_ = state.skipped_iterations;
  logged_nan_ = state.nan_iterations;
  t_interval_ = now_s();
  t_start_ = t_interval_;
  start_iter_ = state.iteration;
}

void IterationLog::record(const StepResult& r, const checkpoint::TrainingState& state, double lr,
                          const optim::GradScaler* scaler) {
  iters_++;
  if (!r.skipped) {
    loss_sum_ += r.loss_sum;
    tokens_ += r.tokens;
    if (moe_losses_.empty()) moe_losses_.assign(r.moe_losses.size(), {nullptr, 0.0});
    for (size_t i = 0; i < r.moe_losses.size() && i < moe_losses_.size(); ++i) {
      moe_losses_[i].first = r.moe_losses[i].first;
      moe_losses_[i].second += r.moe_losses[i].second;
    }
    advanced_ += 1;
  }
  tokens_count_ += opt_.global_batch_size * model_.seq_length;
  const int64_t it = state.iteration;
  if (metrics_) {
    IterationMetrics m;
    m.iteration = it;
    m.consumed_samples = state.consumed_train_samples;
    m.batch_size = opt_.global_batch_size;
    m.learning_rate = lr;
    m.lm_loss = r.tokens > 0 ? r.loss_sum / r.tokens : 0.0;
    m.loss_scale = scaler ? static_cast<double>(scaler->scale()) : 1.0;
    m.grad_norm = r.grad_norm;
    m.params_norm = r.params_norm;
    m.num_zeros = r.num_zeros;
    m.moe_losses = r.moe_losses;
    metrics_->iteration(m);
  }
  if (it % opt_.log_interval == 0) {
    double elapsed = now_s() - t_interval_;
    print_line(elapsed, tokens_ > 0 ? loss_sum_ / tokens_ : 0.0, r, state, lr, scaler);
    iters_ = 0;
    advanced_ = 0;
    moe_losses_.clear();
    loss_sum_ = tokens_ = 0;
    tokens_count_ = 0;
    t_interval_ = now_s();
  } else if (bar_) {
    std::printf("\r%s", progress(it).c_str());
    std::fflush(stdout);
  }
}

// The terminal's progress line between log lines: the interval's bar and the time left at the
// run's average pace so far (evaluations and checkpoints included).
std::string IterationLog::progress(int64_t it) const {
  const int64_t done = it % opt_.log_interval, width = 30;
  const int64_t fill = done * width / opt_.log_interval;
  std::string eta;
  if (it > start_iter_) {
    const double left = (now_s() - t_start_) / static_cast<double>(it - start_iter_) *
                        static_cast<double>(opt_.total_iters - it);
    const auto s = static_cast<int64_t>(left);
    eta = fmt::format(" ETA {}:{:02d}:{:02d}", s / 3600, s / 60 % 60, s % 60);
  }
  return fmt::format(" iteration {}/{} [{}{}]{}", it, opt_.total_iters, std::string(static_cast<size_t>(fill), '#'),
                     std::string(static_cast<size_t>(width - fill), ' '), eta);
}

void IterationLog::print_line(double elapsed_s, double loss, const StepResult& r,
                              const checkpoint::TrainingState& state, double lr, const optim::GradScaler* scaler) {
  const double grad_norm = r.grad_norm;
  const int64_t n = std::max<int64_t>(iters_, 1);
  const double ms = elapsed_s / static_cast<double>(n) * 1000.0;
  const double tflops = flops_per_iteration(model_, opt_.global_batch_size, model_.seq_length) /
                        (elapsed_s / static_cast<double>(n)) / 1e12 /
                        (opt_.per_gpu ? static_cast<double>(pg_.grid.world()) : 1.0);
  const double tok_s = static_cast<double>(tokens_count_) / elapsed_s;
  std::string line = fmt::format(
      " iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | "
      "{}: {:.3f} | tokens per second: {:.0f}{} | learning rate: {:.6E} | "
      "global batch size: {:5d} | lm loss: {:.6E} |{} loss scale: {:.1f} |{}{} "
      "number of skipped iterations: {:3d} | number of nan iterations: {:3d} |",
      state.iteration, opt_.total_iters, state.consumed_train_samples, ms,
      opt_.per_gpu ? "throughput per GPU (TFLOP/s/GPU)" : "throughput (TFLOP/s)", tflops, tok_s,
      opt_.show_mfu ? fmt::format(" | MFU: {:.1f}%", 100.0 * tflops / 989.0) : std::string(), lr,
      opt_.global_batch_size, loss, moe_line(), scaler ? static_cast<double>(scaler->scale()) : 1.0, fp8_line(),
      // A step skipped for an fp16 overflow has no grad norm: Megatron leaves the field out.
      (std::isnan(grad_norm) && scaler ? std::string() : fmt::format(" grad norm: {:.3f} |", grad_norm)) +
          (r.num_zeros ? fmt::format(" num zeros: {:.0f} |", *r.num_zeros) : std::string()) +
          (r.params_norm ? fmt::format(" params norm: {:.3f} |", *r.params_norm) : std::string()),
      state.skipped_iterations - logged_skipped_, state.nan_iterations - logged_nan_);
  if (metrics_) {
    IntervalMetrics m;
    m.iteration = state.iteration;
    m.total_iters = opt_.total_iters;
    m.consumed_samples = state.consumed_train_samples;
    m.batch_size = opt_.global_batch_size;
    m.iteration_time_s = ms / 1000.0;
    m.tflops_per_gpu = tflops;
    m.tokens_per_s = tok_s;
    m.learning_rate = lr;
    m.lm_loss = loss;
    m.loss_scale = scaler ? static_cast<double>(scaler->scale()) : 1.0;
    m.grad_norm = grad_norm;
    m.params_norm = r.params_norm;
    m.num_zeros = r.num_zeros;
    m.skipped = state.skipped_iterations - logged_skipped_;
    m.nan = state.nan_iterations - logged_nan_;
    m.skipped_total = state.skipped_iterations;
    m.nan_total = state.nan_iterations;
    for (const auto& [name, sum] : moe_losses_)
      if (name) m.moe_losses.emplace_back(name, sum / static_cast<double>(std::max<int64_t>(advanced_, 1)));
    metrics_->interval(m);
  }
  // Megatron counts skipped and nan iterations per log interval (the totals go in checkpoints).
  logged_skipped_ = state.skipped_iterations;
  logged_nan_ = state.nan_iterations;
  print(line);
}

// FP8's health over the interval (this rank's layers): elements clipped by saturation, and the
// range of the per-tensor scales.
std::string IterationLog::fp8_line() {
  if (!fp8_) return {};
  const model::Fp8Health h = model::take_fp8_health(*fp8_);
  std::string out = fmt::format(" fp8 saturated: {} |", h.saturated);
  if (h.has_scales) out += fmt::format(" fp8 scale min/max: {:.3E}/{:.3E} |", h.min_scale, h.max_scale);
  return out;
}

// Megatron prints each MoE auxiliary loss after the lm loss, averaged over the interval's
// advanced iterations.
std::string IterationLog::moe_line() const {
  std::string out;
  for (const auto& [name, sum] : moe_losses_)
    if (name) out += fmt::format(" {}: {:.6E} |", name, sum / static_cast<double>(std::max<int64_t>(advanced_, 1)));
  return out;
}

void IterationLog::print(const std::string& text) const {
  // Megatron's print_rank_last: these lines come from a rank that holds the loss, the first
  // rank of the last pipeline stage (rank 0 without PP); other messages come from rank 0.
  if (pg_.rank != log_rank_ || log_level() > LogLevel::Info) return;
  if (opt_.progress_bar && isatty(STDOUT_FILENO)) std::printf("\r\033[K");
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

void IterationLog::validation(const char* set, double loss, int64_t iteration) const {
  std::string body = fmt::format(" validation loss at iteration {} on {} set | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ",
                                 iteration, set, loss, std::exp(std::min(20.0, loss)));
  std::string dash(body.size() + 1, '-');
  print(fmt::format("{}\n{}\n{}", dash, body, dash));
}

void IterationLog::op_breakdown(model::OpTimes& times, double train_time) const {
  std::vector<double> mine = model::category_seconds(times);
  const comm::CommPtr& pp = pg_.pp;
  if (!pp || pp->size() == 1) {
    print(model::format_op_breakdown(mine, train_time));
    return;
  }
  // Every stage's own line (stages do different work: embedding, output layer and loss, and
  // idle bubble time that shows up as "other"), gathered over the pipeline group.
  mine.push_back(train_time);
  const size_t n = mine.size();
  std::vector<double> all(n * static_cast<size_t>(pp->size()));
  pp->all_gather(mine.data(), all.data(), n, comm::DataType::F64);
  for (int s = 0; s < pp->size(); ++s) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(n * static_cast<size_t>(s));
    print(fmt::format("pipeline stage {}: {}", s,
                      model::format_op_breakdown(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(n - 1)),
                                                 *(first + static_cast<std::ptrdiff_t>(n - 1)))));
  }
}

}  // namespace mt
