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
  if (it % opt_.log_interval == 0) {
    double elapsed = now_s() - t_interval_;
    print_line(elapsed, tokens_ > 0 ? loss_sum_ / tokens_ : 0.0, r.grad_norm, state, lr, scaler);
    iters_ = 0;
    advanced_ = 0;
    moe_losses_.clear();
    loss_sum_ = tokens_ = 0;
    tokens_count_ = 0;
    t_interval_ = now_s();
  } else if (bar_) {
    int64_t done = it % opt_.log_interval, width = 30;
    int64_t fill = done * width / opt_.log_interval;
    std::printf("\r iteration %ld/%ld [%s%s]", static_cast<long>(it), static_cast<long>(opt_.total_iters),
                std::string(static_cast<size_t>(fill), '#').c_str(),
                std::string(static_cast<size_t>(width - fill), ' ').c_str());
    std::fflush(stdout);
  }
}

void IterationLog::print_line(double elapsed_s, double loss, double grad_norm, const checkpoint::TrainingState& state,
                              double lr, const optim::GradScaler* scaler) {
  const int64_t n = std::max<int64_t>(iters_, 1);
  const double ms = elapsed_s / static_cast<double>(n) * 1000.0;
  const double tflops = flops_per_iteration(model_, opt_.global_batch_size, model_.seq_length) /
                        (elapsed_s / static_cast<double>(n)) / 1e12 /
                        (opt_.per_gpu ? static_cast<double>(pg_.grid.world()) : 1.0);
  const double tok_s = static_cast<double>(tokens_count_) / elapsed_s;
  std::string line = fmt::format(
      " iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | "
      "{}: {:.3f} | tokens per second: {:.0f}{} | learning rate: {:.6E} | "
      "global batch size: {:5d} | lm loss: {:.6E} |{} loss scale: {:.1f} |{} "
      "number of skipped iterations: {:3d} | number of nan iterations: {:3d} |",
      state.iteration, opt_.total_iters, state.consumed_train_samples, ms,
      opt_.per_gpu ? "throughput per GPU (TFLOP/s/GPU)" : "throughput (TFLOP/s)", tflops, tok_s,
      opt_.show_mfu ? fmt::format(" | MFU: {:.1f}%", 100.0 * tflops / 989.0) : std::string(), lr,
      opt_.global_batch_size, loss, moe_line(), scaler ? static_cast<double>(scaler->scale()) : 1.0,
      // A step skipped for an fp16 overflow has no grad norm: Megatron leaves the field out.
      std::isnan(grad_norm) && scaler ? std::string() : fmt::format(" grad norm: {:.3f} |", grad_norm),
      state.skipped_iterations - logged_skipped_, state.nan_iterations - logged_nan_);
  // Megatron counts skipped and nan iterations per log interval (the totals go in checkpoints).
  logged_skipped_ = state.skipped_iterations;
  logged_nan_ = state.nan_iterations;
  print(line);
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
