#include "training/timers.h"

#include <cstring>

#include "core/error.h"
#include "kernels/device.h"

namespace mt {

const std::vector<std::pair<const char*, int>>& Timers::names() {
  // training.py's training_log: the level-1 list, then the level-2 additions.
  static const std::vector<std::pair<const char*, int>> n = {
      {"forward-backward", 1},
      {"layernorm-grads-all-reduce", 1},
      {"embedding-grads-all-reduce", 1},
      {"all-grads-sync", 1},
      {"params-all-gather", 1},
      {"optimizer-copy-to-main-grad", 1},
      {"optimizer-unscale-and-check-inf", 1},
      {"optimizer-clip-main-grad", 1},
      {"optimizer-count-zeros", 1},
      {"optimizer-inner-step", 1},
      {"optimizer-copy-main-to-model-params", 1},
      {"optimizer", 1},
      {"batch-generator", 2},
      {"forward-compute", 2},
      {"backward-compute", 2},
      {"forward-recv", 2},
      {"forward-send", 2},
      {"backward-recv", 2},
      {"backward-send", 2},
      {"forward-send-forward-recv", 2},
      {"forward-send-backward-recv", 2},
      {"backward-send-forward-recv", 2},
      {"backward-send-backward-recv", 2},
      {"forward-backward-send-forward-backward-recv", 2},
  };
  return n;
}

Timers::Timers(int level, std::string option, comm::CommPtr world, bool gpu)
    : level_(level), option_(std::move(option)), world_(std::move(world)), gpu_(gpu) {
  const size_t n = names().size();
  total_.assign(n, 0.0);
  started_.resize(n);
  running_.assign(n, false);
}

int Timers::index(const char* name) const {
  const auto& n = names();
  for (size_t i = 0; i < n.size(); ++i)
    if (std::strcmp(n[i].first, name) == 0) return static_cast<int>(i);
  MT_CHECK(false, "no timer named {}", name);
  return -1;
}

void Timers::start(const char* name) {
  const int i = index(name);
  if (!on(names()[static_cast<size_t>(i)].second)) return;
  MT_CHECK(!running_[static_cast<size_t>(i)], "timer {} started twice", name);
  if (gpu_) ops::gpu_context().synchronize();  // time what the device did, not the launches
  running_[static_cast<size_t>(i)] = true;
  started_[static_cast<size_t>(i)] = std::chrono::steady_clock::now();
}

void Timers::stop(const char* name) {
  const auto u = static_cast<size_t>(index(name));
  if (!running_[u]) return;  // a timer of a level that is off
  if (gpu_) ops::gpu_context().synchronize();
  total_[u] += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_[u]).count();
  running_[u] = false;
}

Timers::Report Timers::report(int64_t iterations) {
  Report r;
  if (level_ == 0) return r;
  const auto& n = names();
  const size_t k = n.size();
  const int world = world_ ? world_->size() : 1;
  std::vector<double> all(k * static_cast<size_t>(world));
  if (world_ && world > 1) world_->all_gather(total_.data(), all.data(), k, comm::DataType::F64);
  else all = total_;
  std::fill(total_.begin(), total_.end(), 0.0);
  const double per = 1.0 / static_cast<double>(std::max<int64_t>(iterations, 1));
  auto at = [&](int rank, size_t i) { return all[static_cast<size_t>(rank) * k + i]; };
  std::string out;
  for (size_t i = 0; i < k; ++i) {
    // As Megatron: a timer no rank ran (0 everywhere) is left out; min and max over the ranks
    // that ran it.
    double lo = 0, hi = 0;
    bool any = false;
    for (int q = 0; q < world; ++q)
      if (at(q, i) > 0) {
        lo = any ? std::min(lo, at(q, i)) : at(q, i);
        hi = any ? std::max(hi, at(q, i)) : at(q, i);
        any = true;
      }
    if (!any) continue;
    r.max_seconds.emplace_back(n[i].first, hi * per);
    const std::string label = std::string(n[i].first) + " ";
    const std::string dotted = label.size() < 48 ? label + std::string(48 - label.size(), '.') : label;
    if (option_ == "max") out += fmt::format("\n    {}: {:.2f}", dotted, hi * per * 1e3);
    else if (option_ == "minmax") out += fmt::format("\n    {}: ({:.2f}, {:.2f})", dotted, lo * per * 1e3, hi * per * 1e3);
    else {
      out += fmt::format("\n  {}:", n[i].first);
      for (int q = 0; q < world; ++q)
        if (at(q, i) > 0) out += fmt::format("\n     rank {:2d}: {:.2f}", q, at(q, i) * per * 1e3);
    }
  }
  if (out.empty()) return r;
  const char* head = option_ == "max"      ? "max time across ranks (ms):"
                     : option_ == "minmax" ? "(min, max) time across ranks (ms):"
                                           : "times across ranks (ms):";
  r.text = head + out;
  return r;
}

}  // namespace mt
