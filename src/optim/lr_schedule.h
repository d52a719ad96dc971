#pragma once
// Megatron's OptimizerParamScheduler: learning rate (and weight decay) as a function of the
// number of samples consumed, with warm-up then constant / linear / cosine /
// inverse-square-root / WSD decay. Megatron counts in samples when --*-samples flags are
// used and in iterations * global batch size otherwise; both reduce to "steps" here.
#include <cstdint>
#include <optional>
#include <string>

namespace mt::optim {

struct LRScheduleConfig {
  double max_lr = 1e-4;              // --lr
  double min_lr = 0.0;               // --min-lr
  int64_t warmup_steps = 0;          // in samples (iters * global batch) like Megatron
  int64_t decay_steps = 0;           // in samples
  std::string decay_style = "linear";  // constant | linear | cosine | inverse-square-root | WSD
  int64_t wsd_decay_steps = 0;       // in samples (--lr-wsd-decay-iters/-samples)
  std::string wsd_decay_style = "exponential";  // --lr-wsd-decay-style: linear|cosine|exponential|minus_sqrt
  double lr_warmup_init = 0.0;       // --lr-warmup-init
  // Megatron's decoupled group (the word embedding and the output layer): the same schedule with
  // max_lr = --decoupled-lr and min_lr = --decoupled-min-lr (or --min-lr when that is unset).
  std::optional<double> decoupled_lr, decoupled_min_lr;
  // Weight decay schedule (--start-weight-decay, --end-weight-decay, --weight-decay-incr-style).
  double start_wd = 0.01, end_wd = 0.01;
  std::string wd_incr_style = "constant";  // constant | linear | cosine
  int64_t wd_incr_steps = 0;         // in samples (Megatron: --train-iters * global batch, or --train-samples)
};

class LRSchedule {
 public:
  explicit LRSchedule(const LRScheduleConfig& cfg);  // throws mt::Error on invalid settings
  double lr(int64_t num_steps) const;  // num_steps in samples
  // The decoupled group's lr at num_steps: lr(num_steps) without --decoupled-lr.
  double decoupled_lr(int64_t num_steps) const;
  double weight_decay(int64_t num_steps) const;
  const LRScheduleConfig& config() const { return cfg_; }

 private:
  double lr(int64_t num_steps, double max_lr, double min_lr) const;  // Megatron's get_lr(param_group)
  LRScheduleConfig cfg_;
};

}  // namespace mt::optim
