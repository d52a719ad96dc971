// Megatron's OptimizerParamScheduler.get_lr / get_wd, branch for branch, in double as the
// Python original. Its constructor asserts become messages naming the flags behind them.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>

#include "core/error.h"

namespace mt::optim {

namespace {
bool one_of(const std::string& s, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (s == o) return true;
  return false;
}

void validate(const LRScheduleConfig& c) {
  if (!(c.min_lr >= 0.0)) mt::fail("--min-lr must be >= 0, got {}", c.min_lr);
  if (!(c.max_lr >= c.min_lr)) mt::fail("--min-lr ({}) must not exceed --lr ({})", c.min_lr, c.max_lr);
  if (!(c.lr_warmup_init <= c.max_lr))
    mt::fail("--lr-warmup-init ({}) must not exceed --lr ({})", c.lr_warmup_init, c.max_lr);
  if (!one_of(c.decay_style, {"constant", "linear", "cosine", "inverse-square-root", "WSD"}))
    mt::fail("--lr-decay-style must be one of constant, linear, cosine, inverse-square-root, WSD; got '{}'",
             c.decay_style);
  if (c.warmup_steps < 0)
    mt::fail("--lr-warmup-iters/--lr-warmup-samples must be >= 0, got {} samples", c.warmup_steps);
  if (c.decay_steps <= 0)
    mt::fail("--lr-decay-iters/--lr-decay-samples must be > 0 (they default to --train-iters/--train-samples), "
             "got {} samples", c.decay_steps);
  if (c.warmup_steps >= c.decay_steps)
    mt::fail("--lr-warmup-iters/--lr-warmup-samples/--lr-warmup-fraction ({} samples) must be smaller than "
             "--lr-decay-iters/--lr-decay-samples ({} samples)", c.warmup_steps, c.decay_steps);
  if (c.decay_style == "WSD") {
    if (c.wsd_decay_steps <= 0)
      mt::fail("--lr-decay-style WSD needs --lr-wsd-decay-iters/--lr-wsd-decay-samples > 0, got {} samples",
               c.wsd_decay_steps);
    // Megatron does not check this; past it the anneal ratio exceeds 1 and the lr drops
    // below --min-lr (or rises again for cosine), which is never what was meant.
    if (c.wsd_decay_steps > c.decay_steps)
      mt::fail("--lr-wsd-decay-iters/--lr-wsd-decay-samples ({} samples) must not exceed "
               "--lr-decay-iters/--lr-decay-samples ({} samples)", c.wsd_decay_steps, c.decay_steps);
    if (!one_of(c.wsd_decay_style, {"linear", "cosine", "exponential", "minus_sqrt"}))
      mt::fail("--lr-wsd-decay-style must be one of linear, cosine, exponential, minus_sqrt; got '{}'",
               c.wsd_decay_style);
  }
  if (c.decoupled_lr) {
    const double dmin = c.decoupled_min_lr.value_or(c.min_lr);
    if (!(*c.decoupled_lr >= 0.0)) mt::fail("--decoupled-lr must be >= 0, got {}", *c.decoupled_lr);
    // Megatron asserts this for --lr only; past it the decoupled group's lr would rise while decaying.
    if (!(dmin >= 0.0 && dmin <= *c.decoupled_lr))
      mt::fail("--decoupled-min-lr ({}, or --min-lr when unset) must be in [0, --decoupled-lr ({})]", dmin,
               *c.decoupled_lr);
  } else if (c.decoupled_min_lr) {
    mt::fail("--decoupled-min-lr needs --decoupled-lr (it is the decoupled group's floor)");
  }
  if (!(c.start_wd >= 0.0)) mt::fail("--start-weight-decay must be >= 0, got {}", c.start_wd);
  if (!(c.end_wd >= c.start_wd))
    mt::fail("--end-weight-decay ({}) must be >= --start-weight-decay ({})", c.end_wd, c.start_wd);
  if (!one_of(c.wd_incr_style, {"constant", "linear", "cosine"}))
    mt::fail("--weight-decay-incr-style must be one of constant, linear, cosine; got '{}'", c.wd_incr_style);
  if (c.wd_incr_style == "constant" && c.start_wd != c.end_wd)
    mt::fail("--weight-decay-incr-style constant needs --start-weight-decay ({}) == --end-weight-decay ({})",
             c.start_wd, c.end_wd);
  if (c.wd_incr_style != "constant" && c.wd_incr_steps <= 0)
    mt::fail("--weight-decay-incr-style {} needs a training length (--train-iters or --train-samples), got {} "
             "samples", c.wd_incr_style, c.wd_incr_steps);
}

double cosine_coeff(double ratio) { return 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0); }
}  // namespace

LRSchedule::LRSchedule(const LRScheduleConfig& cfg) : cfg_(cfg) { validate(cfg_); }

double LRSchedule::lr(int64_t num_steps) const { return lr(num_steps, cfg_.max_lr, cfg_.min_lr); }

double LRSchedule::decoupled_lr(int64_t num_steps) const {
  if (!cfg_.decoupled_lr) return lr(num_steps);
  return lr(num_steps, *cfg_.decoupled_lr, cfg_.decoupled_min_lr.value_or(cfg_.min_lr));
}

// Megatron's get_lr(param_group): every group shares the warm-up start, the lengths and the
// styles; only max_lr and min_lr are the group's.
double LRSchedule::lr(int64_t num_steps, double max_lr, double min_lr) const {
  MT_CHECK(num_steps >= 0, "num_steps {}", num_steps);
  const LRScheduleConfig& c = cfg_;
  const double n = static_cast<double>(num_steps);

  if (c.warmup_steps > 0 && num_steps <= c.warmup_steps)
    return c.lr_warmup_init + (max_lr - c.lr_warmup_init) * n / static_cast<double>(c.warmup_steps);

  // Constant ignores decay_steps entirely: it stays at max_lr, even past the decay horizon.
  if (c.decay_style == "constant") return max_lr;

  if (num_steps > c.decay_steps) return min_lr;

  if (c.decay_style == "inverse-square-root") {
    // pow(x, 0.5) rather than sqrt: Python's ** calls C pow, and this keeps its bits.
    const double warmup = static_cast<double>(std::max<int64_t>(c.warmup_steps, 1));
    const double steps = static_cast<double>(std::max<int64_t>(num_steps, 1));
    const double lr = max_lr * std::pow(warmup, 0.5) / std::pow(steps, 0.5);
    return std::max(min_lr, lr);
  }

  const double decay_ratio =
      static_cast<double>(num_steps - c.warmup_steps) / static_cast<double>(c.decay_steps - c.warmup_steps);
  const double delta_lr = max_lr - min_lr;
  double coeff = 1.0;
  if (c.decay_style == "linear") {
    coeff = 1.0 - decay_ratio;
  } else if (c.decay_style == "cosine") {
    coeff = cosine_coeff(decay_ratio);
  } else {  // WSD: stable at max_lr, then anneal over the last wsd_decay_steps.
    const int64_t anneal_start = c.decay_steps - c.wsd_decay_steps;
    if (num_steps > anneal_start) {
      const double r = static_cast<double>(num_steps - anneal_start) / static_cast<double>(c.wsd_decay_steps);
      if (c.wsd_decay_style == "linear") {
        coeff = 1.0 - r;
      } else if (c.wsd_decay_style == "cosine") {
        coeff = cosine_coeff(r);
      } else if (c.wsd_decay_style == "exponential") {
        coeff = 2.0 * std::pow(0.5, r) - 1.0;
      } else {  // minus_sqrt
        coeff = 1.0 - std::sqrt(r);
      }
    }
  }
  return min_lr + coeff * delta_lr;
}

double LRSchedule::weight_decay(int64_t num_steps) const {
  MT_CHECK(num_steps >= 0, "num_steps {}", num_steps);
  const LRScheduleConfig& c = cfg_;
  if (num_steps > c.wd_incr_steps || c.wd_incr_style == "constant") return c.end_wd;
  const double ratio = static_cast<double>(num_steps) / static_cast<double>(c.wd_incr_steps);
  // Cosine rises from start to end: the lr's cosine mirrored (cos(pi*(1-ratio))).
  const double coeff = c.wd_incr_style == "linear" ? ratio : cosine_coeff(1.0 - ratio);
  return c.start_wd + coeff * (c.end_wd - c.start_wd);
}

}  // namespace mt::optim
