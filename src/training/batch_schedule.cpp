#include "training/batch_schedule.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

#include "core/checked.h"
#include "core/error.h"
#include "training/arguments.h"

namespace mt {
namespace {

int64_t parse_count(const std::string& text, const std::string& entry) {
  std::string v = text;
  double mult = 1;
  if (!v.empty()) {
    switch (std::toupper(static_cast<unsigned char>(v.back()))) {
      case 'K': mult = 1e3; break;
      case 'M': mult = 1e6; break;
      case 'B': mult = 1e9; break;
      case 'T': mult = 1e12; break;
      default: break;
    }
    if (mult != 1) v.pop_back();
  }
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0 || x * mult > 9e15)
    fail("--step-batch-size-schedule: '{}' in '{}' is not a count (a number with an optional K, M, B or T)", text, entry);
  return static_cast<int64_t>(x * mult);
}

int64_t int_word(const std::string& w, const char* what) {
  char* end = nullptr;
  const long long v = std::strtoll(w.c_str(), &end, 10);
  if (w.empty() || *end != '\0' || v <= 0 || v > (int64_t{1} << 48))
    fail("--rampup-batch-size: {} must be a positive integer, got '{}'", what, w);
  return v;
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> parse_step_schedule(const std::string& s, int64_t seq_length) {
  std::string text = s;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream in(text);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (std::string entry; in >> entry;) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      fail("--step-batch-size-schedule: entry '{}' is not THRESHOLD:BATCH_SIZE", entry);
    int64_t threshold = parse_count(entry.substr(0, colon), entry);
    const int64_t bs = parse_count(entry.substr(colon + 1), entry);
    if (bs <= 0) fail("--step-batch-size-schedule: entry '{}' has batch size 0", entry);
    if (seq_length > 0) threshold /= seq_length;  // tokens -> samples, as Megatron
    out.emplace_back(threshold, bs);
  }
  if (out.empty()) fail("--step-batch-size-schedule is empty; give \"0:BS THRESHOLD:BS ...\"");
  std::sort(out.begin(), out.end());
  if (out[0].first != 0) fail("--step-batch-size-schedule: the first entry must start at 0 (got {} samples)", out[0].first);
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      fail("--step-batch-size-schedule: two entries start at {} samples; thresholds must increase", out[i].first);
  return out;
}

BatchSchedule::BatchSchedule(const Arguments& a) : final_(a.global_batch_size) {
  // validate_training_args derives the global batch first; every size below divides by it.
  MT_CHECK(final_ > 0, "a batch schedule for a global batch size of {}", final_);
  if (!a.step_batch_size_schedule.empty()) steps_ = parse_step_schedule(a.step_batch_size_schedule, a.model.seq_length);
  if (a.rampup_batch_size.size() == 3) {
    rampup_start_ = int_word(a.rampup_batch_size[0], "the start batch size");
    rampup_increment_ = int_word(a.rampup_batch_size[1], "the increment");
    rampup_samples_ = int_word(a.rampup_batch_size[2], "the ramp-up samples");
    const int64_t increments = (final_ - rampup_start_) / rampup_increment_;
    rampup_samples_per_increment_ = increments > 0 ? static_cast<double>(rampup_samples_) / increments : 0;
    if (increments == 0) rampup_increment_ = 0;  // START = GBS: constant
  }
}

int64_t BatchSchedule::at(int64_t consumed) const {
  if (!steps_.empty()) {
    int64_t bs = steps_[0].second;
    for (const auto& [from, b] : steps_)
      if (consumed >= from) bs = b;
    return bs;
  }
  if (rampup_increment_ == 0 || consumed > rampup_samples_) return final_;
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / rampup_samples_per_increment_);
  return std::min(final_, rampup_start_ + steps * rampup_increment_);
}

int64_t BatchSchedule::iterations_for(int64_t samples) const {
  if (constant()) return samples / final_;
  int64_t consumed = 0, iters = 0;
  // Ramps are short next to training; beyond the last change every step is the final size.
  while (consumed < samples) {
    const int64_t bs = at(consumed);
    const bool settled = steps_.empty() ? consumed > rampup_samples_ : consumed >= steps_.back().first;
    if (settled) return iters + (samples - consumed) / bs;
    consumed += bs;
    ++iters;
  }
  return iters;
}

void validate_batch_schedule_args(Arguments& a) {
  const bool ramp = !a.rampup_batch_size.empty(), steps = !a.step_batch_size_schedule.empty();
  if (!ramp && !steps) return;
  if (ramp && steps) fail("use only one of --rampup-batch-size and --step-batch-size-schedule");
  const int64_t unit = checked_mul(a.micro_batch_size, a.data_parallel_size, "--micro-batch-size x data-parallel size");
  auto check_multiple = [&](int64_t bs, const std::string& what) {
    if (bs % unit != 0)
      fail("{}: batch size {} is not a multiple of --micro-batch-size ({}) x data-parallel size ({})", what, bs,
           a.micro_batch_size, a.data_parallel_size);
  };
  if (steps) {
    const auto s = parse_step_schedule(a.step_batch_size_schedule, a.model.seq_length);
    // Megatron 0.20 refuses --global-batch-size beside a schedule; one that agrees with the
    // schedule's final size is harmless, so only a disagreement is an error here.
    if (a.global_batch_size != 0 && a.global_batch_size != s.back().second)
      fail("--global-batch-size {} disagrees with --step-batch-size-schedule, whose last batch size is {}; drop one",
           a.global_batch_size, s.back().second);
    a.global_batch_size = s.back().second;
    for (const auto& [from, bs] : s) check_multiple(bs, "--step-batch-size-schedule");
    return;
  }
  if (a.rampup_batch_size.size() != 3)
    fail("--rampup-batch-size takes three values: START INCREMENT SAMPLES (got {})", a.rampup_batch_size.size());
  if (a.global_batch_size == 0) fail("--rampup-batch-size ramps up to --global-batch-size: give it");
  const int64_t start = int_word(a.rampup_batch_size[0], "the start batch size");
  const int64_t incr = int_word(a.rampup_batch_size[1], "the increment");
  int_word(a.rampup_batch_size[2], "the ramp-up samples");
  if (start > a.global_batch_size)
    fail("--rampup-batch-size: the start batch size {} is above --global-batch-size {}", start, a.global_batch_size);
  if ((a.global_batch_size - start) % incr != 0)
    fail("--rampup-batch-size: --global-batch-size {} minus the start {} is not a multiple of the increment {}",
         a.global_batch_size, start, incr);
  check_multiple(start, "--rampup-batch-size start");
  check_multiple(incr, "--rampup-batch-size increment");
}

}  // namespace mt
