#include "training/run_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/device.h"

namespace mt {

MemoryMetrics memory_metrics(bool gpu) {
  MemoryMetrics m;
  if (gpu) {  // the run's allocator keeps a peak only
    m.max_allocated_bytes = static_cast<double>(ops::gpu_context().peak_memory_bytes());
    m.allocated_bytes = std::nan("");
    return m;
  }
  // /proc/self/statm: size and resident pages; getrusage: the peak resident set in KiB.
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      m.allocated_bytes = static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) m.max_allocated_bytes = static_cast<double>(ru.ru_maxrss) * 1024.0;
  return m;
}

RunMetrics::RunMetrics(RunMetricsOptions o) : o_(std::move(o)) {
  const OpsArgs& a = o_.ops;
  if (!a.tensorboard_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(a.tensorboard_dir, a.tensorboard_queue_size);
  if (a.metrics_port > 0) server_ = std::make_unique<MetricsServer>(a.metrics_bind_address, static_cast<int>(a.metrics_port));
  if (!a.metrics_jsonl.empty()) {
    const auto parent = std::filesystem::path(a.metrics_jsonl).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    jsonl_.open(a.metrics_jsonl, std::ios::app);
    if (!jsonl_) fail("--metrics-jsonl {}: cannot open the file for appending", a.metrics_jsonl);
  }
}

RunMetrics::~RunMetrics() = default;

// Megatron writes most scalars twice: against the iteration and, as '<tag> vs samples', against
// the consumed samples (curves of runs with different batch sizes line up on the latter).
void RunMetrics::scalar(const std::string& tag, double value, int64_t iteration, int64_t samples) {
  tb_->add_scalar(tag, value, iteration);
  if (samples >= 0) tb_->add_scalar(tag + " vs samples", value, samples);
}

void RunMetrics::iteration(const IterationMetrics& m) {
  const OpsArgs& a = o_.ops;
  if (!tb_ || m.iteration % a.tensorboard_log_interval != 0) return;
  const int64_t it = m.iteration, s = m.consumed_samples;
  scalar("learning-rate", m.learning_rate, it, s);
  scalar("batch-size", static_cast<double>(m.batch_size), it, s);
  scalar("lm loss", m.lm_loss, it, s);
  if (a.log_loss_scale_to_tensorboard) scalar("loss-scale", m.loss_scale, it, s);
  if (a.log_world_size_to_tensorboard) scalar("world-size", static_cast<double>(o_.world_size), it, s);
  if (!std::isnan(m.grad_norm)) scalar("grad-norm", m.grad_norm, it, s);
  if (m.num_zeros) scalar("num-zeros", *m.num_zeros, it, s);
  if (m.params_norm) scalar("params-norm", *m.params_norm, it, s);
  for (const auto& [name, v] : m.moe_losses) tb_->add_scalar(name, v, it);
  if (a.log_memory_to_tensorboard) {
    const MemoryMetrics mem = memory_metrics(o_.gpu);
    if (!std::isnan(mem.allocated_bytes)) tb_->add_scalar("mem-allocated-bytes", mem.allocated_bytes, it);
    tb_->add_scalar("mem-max-allocated-bytes", mem.max_allocated_bytes, it);
  }
}

void RunMetrics::timers(int64_t iteration, const std::vector<std::pair<std::string, double>>& max_seconds) {
  pending_timers_ = max_seconds;
  if (tb_ && o_.ops.log_timers_to_tensorboard)
    for (const auto& [name, sec] : max_seconds) tb_->add_scalar(name + "-time", sec, iteration);
}

void RunMetrics::interval(const IntervalMetrics& m) {
  if (tb_ && o_.ops.log_timers_to_tensorboard) {
    tb_->add_scalar("iteration-time", m.iteration_time_s, m.iteration);
    if (o_.ops.log_throughput) tb_->add_scalar("throughput", m.tflops_per_gpu, m.iteration);
  }
  const MemoryMetrics mem = memory_metrics(o_.gpu);
  if (server_) {
    auto& s = *server_;
    s.set("megatron:iteration", static_cast<double>(m.iteration), "the last finished training iteration");
    s.set("megatron:train_iters", static_cast<double>(m.total_iters), "iterations this run trains for");
    s.set("megatron:consumed_samples", static_cast<double>(m.consumed_samples), "training samples consumed");
    s.set("megatron:iteration_time_seconds", m.iteration_time_s, "wall time per iteration over the last log interval");
    s.set("megatron:tokens_per_second", m.tokens_per_s, "training tokens per second over the last log interval");
    s.set("megatron:tflops_per_gpu", m.tflops_per_gpu, "model TFLOP/s per GPU (Megatron's formula)");
    s.set("megatron:lm_loss", m.lm_loss, "lm loss averaged over the last log interval");
    s.set("megatron:grad_norm", m.grad_norm, "gradient norm of the last iteration (NaN: skipped)");
    s.set("megatron:loss_scale", m.loss_scale, "fp16 loss scale (1 without --fp16)");
    s.set("megatron:learning_rate", m.learning_rate, "learning rate");
    s.set("megatron:skipped_iterations_total", static_cast<double>(m.skipped_total),
          "iterations whose update was skipped", "counter");
    s.set("megatron:nan_iterations_total", static_cast<double>(m.nan_total),
          "iterations with a NaN/Inf loss or grad norm", "counter");
    if (m.params_norm) s.set("megatron:params_norm", *m.params_norm, "parameters' norm");
    if (m.num_zeros) s.set("megatron:num_zeros_in_grad", *m.num_zeros, "zeros in the gradient");
    if (!std::isnan(mem.allocated_bytes))
      s.set("megatron:memory_allocated_bytes", mem.allocated_bytes, "memory in use (host resident set on the CPU)");
    s.set("megatron:memory_max_allocated_bytes", mem.max_allocated_bytes,
          "peak memory (GPU allocator peak, or the host's peak resident set)");
  }
  if (jsonl_.is_open()) {
    nlohmann::json j;
    j["type"] = "train";
    j["iteration"] = m.iteration;
    j["train_iters"] = m.total_iters;
    j["consumed_samples"] = m.consumed_samples;
    j["iteration_time_s"] = m.iteration_time_s;
    j["tokens_per_s"] = m.tokens_per_s;
    j["tflops_per_gpu"] = m.tflops_per_gpu;
    j["learning_rate"] = m.learning_rate;
    j["global_batch_size"] = m.batch_size;
    j["lm_loss"] = m.lm_loss;
    j["loss_scale"] = m.loss_scale;
    // JSON has no NaN: a missing or non-finite value is null.
    auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
    j["grad_norm"] = num(m.grad_norm);
    j["lm_loss"] = num(m.lm_loss);
    if (m.params_norm) j["params_norm"] = num(*m.params_norm);
    if (m.num_zeros) j["num_zeros"] = num(*m.num_zeros);
    for (const auto& [name, v] : m.moe_losses) j[name] = num(v);
    j["skipped_iterations"] = m.skipped;
    j["nan_iterations"] = m.nan;
    j["memory_max_allocated_bytes"] = mem.max_allocated_bytes;
    if (!pending_timers_.empty()) {
      nlohmann::json t;
      for (const auto& [name, sec] : pending_timers_) t[name] = sec;
      j["timers_max_s"] = t;
    }
    jsonl(j.dump());
  }
  pending_timers_.clear();
  flush();
}

void RunMetrics::validation(int64_t iteration, int64_t consumed_samples, double loss) {
  const double ppl = std::exp(std::min(20.0, loss));
  if (tb_) {
    scalar("lm loss validation", loss, iteration, consumed_samples);
    if (o_.ops.log_validation_ppl_to_tensorboard) scalar("lm loss validation ppl", ppl, iteration, consumed_samples);
  }
  if (server_) {
    server_->set("megatron:lm_loss_validation", loss, "validation lm loss of the last evaluation");
    server_->set("megatron:lm_loss_validation_ppl", ppl, "validation perplexity of the last evaluation");
  }
  if (jsonl_.is_open()) {
    nlohmann::json j;
    j["type"] = "validation";
    j["iteration"] = iteration;
    j["lm_loss"] = std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr);
    j["lm_loss_ppl"] = std::isfinite(ppl) ? nlohmann::json(ppl) : nlohmann::json(nullptr);
    jsonl(j.dump());
  }
  flush();
}

void RunMetrics::jsonl(const std::string& line) {
  jsonl_ << line << '\n';
  jsonl_.flush();
  if (!jsonl_) fail("--metrics-jsonl {}: cannot write (disk full?)", o_.ops.metrics_jsonl);
}

void RunMetrics::flush() {
  if (tb_) tb_->flush();
}

}  // namespace mt
