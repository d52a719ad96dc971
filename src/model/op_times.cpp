#include "model/op_times.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/device.h"

namespace mt::model {
namespace {

constexpr double OpTimes::* kFields[] = {&OpTimes::gemm,      &OpTimes::attention, &OpTimes::norm,
                                         &OpTimes::elementwise, &OpTimes::loss,      &OpTimes::optimizer,
                                         &OpTimes::communication, &OpTimes::router, &OpTimes::permute,
                                         &OpTimes::expert_gemm,   &OpTimes::unpermute, &OpTimes::fp8_cast};
constexpr int kCategories = static_cast<int>(std::size(kFields));
constexpr int kFirstMoeCategory = 7;  // router onwards (and FP8's casts): shown where they took time
constexpr const char* kNames[kCategories] = {"GEMM", "attention", "norms", "elementwise", "loss", "optimizer",
                                             "communication", "MoE router", "MoE permute", "MoE expert GEMMs",
                                             "MoE unpermute", "FP8 casts"};

int category_of(double OpTimes::*f) {
  for (int i = 0; i < kCategories; ++i)
    if (kFields[i] == f) return i;
  fail("OpTimes: unknown category field");
}

}  // namespace

OpTimes::OpTimes() = default;
OpTimes::~OpTimes() = default;

void OpTimes::set_device(Device d) {
  MT_CHECK(open_.empty(), "OpTimes::set_device while {} timing scopes are open", open_.size());
  if ((d == Device::CUDA) == on_device()) return;
  if (d == Device::CPU) {
    resolve();
    dev_.reset();
    return;
  }
  dev_ = std::make_unique<ops::EventTimeline>(kCategories);  // fails in a build without CUDA
}

void OpTimes::mark() noexcept {
  const int top = open_.empty() ? -1 : open_.back();
  if (dev_) {
    dev_->mark(top);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (top >= 0) this->*kFields[top] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void OpTimes::begin(double OpTimes::*field) {
  const int c = category_of(field);
  mark();  // closes the enclosing scope's span (if any) here
  open_.push_back(static_cast<int8_t>(c));
}

void OpTimes::end() noexcept {
  if (open_.empty()) return;
  mark();  // charges the span since the last boundary to this scope
  open_.pop_back();
}

void OpTimes::resolve() {
  if (dev_) {
    double s[kCategories] = {};
    dev_->resolve(s);
    for (int i = 0; i < kCategories; ++i) this->*kFields[i] += s[i];
  }
}

void OpTimes::reset() {
  resolve();
  for (auto f : kFields) this->*f = 0;
}

double OpTimes::sum() const {
  double s = 0;
  for (auto f : kFields) s += this->*f;
  return s;
}

std::vector<double> category_seconds(OpTimes& t) {
  t.resolve();
  std::vector<double> out;
  for (int i = 0; i < kCategories; ++i) out.push_back(t.*kFields[i]);
  return out;
}

std::string format_op_breakdown(const std::vector<double>& seconds, double total_seconds) {
  MT_CHECK(seconds.size() == static_cast<size_t>(kCategories), "op breakdown of {} categories", seconds.size());
  double timed = 0;
  for (double v : seconds) timed += v;
  const double total = total_seconds > 0 ? total_seconds : timed;
  const double other = std::max(0.0, total - timed);
  auto pct = [&](double v) { return total > 0 ? 100.0 * v / total : 0.0; };
  std::string out = fmt::format("time breakdown over {:.2f} s:", total);
  for (int i = 0; i < kCategories; ++i) {
    // The MoE categories appear only where MoE layers ran (dense models keep their line).
    if (i >= kFirstMoeCategory && seconds[static_cast<size_t>(i)] == 0) continue;
    out += fmt::format(" {} {:.1f}% |", kNames[i], pct(seconds[static_cast<size_t>(i)]));
  }
  out += fmt::format(" other {:.1f}%", pct(other));
  // Timed spans longer than the step mean the caller's step time misses part of the work.
  if (timed > total * 1.001) out += fmt::format(" (timed ops exceed the step time by {:.1f}%)", pct(timed - total));
  return out;
}

std::string format_op_breakdown(OpTimes& t, double total_seconds) {
  return format_op_breakdown(category_seconds(t), total_seconds);
}

}  // namespace mt::model
