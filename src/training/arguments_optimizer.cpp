// Pretrain's optimizer section: the optimizer, the learning-rate and weight-decay schedules,
// gradient clipping and fp16 loss scaling. The parser already refuses inf, nan and numbers out
// of each flag's own range; what is left are ranges that depend on the flag's meaning (a beta in
// [0, 1)) and rules between flags.
#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {
namespace {

// Each check is written as "not in the good range", so a NaN (from anywhere) fails it too.
void at_least_zero(const char* flag, double v) {
  if (!(v >= 0.0)) fail("{} must be >= 0 (got {})", flag, v);
}

void fraction_below_one(const char* flag, double v) {
  if (!(v >= 0.0 && v < 1.0)) fail("{} must be in [0, 1) (got {})", flag, v);
}

}  // namespace

void register_optimizer_flags(FlagParser& p, OptimizerArgs& a) {
  p.value("--optimizer", &a.optimizer.type, "optimizer", {"adam", "sgd"});
  p.value("--lr", &a.optimizer.lr, "peak learning rate");
  p.value("--min-lr", &a.min_lr, "minimum learning rate");
  p.value("--lr-decay-style", &a.lr_decay_style, "decay style",
          {"constant", "linear", "cosine", "inverse-square-root", "WSD"});
  p.value("--lr-decay-iters", &a.lr_decay_iters, "iterations of decay (default --train-iters)", {1, kMaxSteps});
  p.value("--lr-decay-samples", &a.lr_decay_samples, "samples of decay (default --train-samples)", {1, kMaxSteps});
  p.value("--lr-warmup-iters", &a.lr_warmup_iters, "iterations of linear warm-up", {0, kMaxSteps});
  p.value("--lr-warmup-samples", &a.lr_warmup_samples, "samples of linear warm-up", {0, kMaxSteps});
  p.value("--lr-warmup-fraction", &a.lr_warmup_fraction, "warm-up as a fraction of the decay length");
  p.value("--lr-warmup-init", &a.lr_warmup_init, "learning rate at the start of warm-up");
  p.value("--lr-wsd-decay-style", &a.lr_wsd_decay_style, "WSD decay style",
          {"exponential", "linear", "cosine", "minus_sqrt"});
  p.value("--lr-wsd-decay-iters", &a.lr_wsd_decay_iters, "iterations of the WSD decay phase", {1, kMaxSteps});
  p.value("--lr-wsd-decay-samples", &a.lr_wsd_decay_samples, "samples of the WSD decay phase", {1, kMaxSteps});
  p.value("--weight-decay", &a.optimizer.weight_decay, "weight decay (default 0.01)");
  p.value("--start-weight-decay", &a.start_weight_decay, "weight decay at the start (with an incr style)");
  p.value("--end-weight-decay", &a.end_weight_decay, "weight decay at the end");
  p.value("--weight-decay-incr-style", &a.weight_decay_incr_style, "weight decay schedule",
          {"constant", "linear", "cosine"});
  p.value("--clip-grad", &a.clip_grad, "global gradient-norm clipping (default 1.0; 0 disables)");
  p.value("--adam-beta1", &a.optimizer.adam_beta1, "Adam beta1 (default 0.9)");
  p.value("--adam-beta2", &a.optimizer.adam_beta2, "Adam beta2 (default 0.999)");
  p.value("--adam-eps", &a.optimizer.adam_eps, "Adam epsilon (default 1e-8)");
  p.value("--sgd-momentum", &a.optimizer.sgd_momentum, "SGD momentum (default 0.9)");
  p.value("--loss-scale", &a.grad_scaler.loss_scale,
          "static loss scale (--fp16; powers of 2 work best); unset: dynamic loss scaling");
  p.value("--initial-loss-scale", &a.grad_scaler.initial_loss_scale, "initial dynamic loss scale (default 2^32)");
  p.value("--min-loss-scale", &a.grad_scaler.min_loss_scale, "minimum dynamic loss scale (default 1.0)");
  p.value("--loss-scale-window", &a.grad_scaler.loss_scale_window,
          "clean iterations before the dynamic loss scale doubles (default 1000)", {1, kMaxSteps});
  p.value("--hysteresis", &a.grad_scaler.hysteresis,
          "overflowing iterations tolerated before the dynamic loss scale halves (default 2)", {0, kMaxSteps});
}

void validate_optimizer_args(const Arguments& a) {
  if (a.train_iters > 0) {
    if (a.lr_decay_samples || a.lr_warmup_samples || a.lr_wsd_decay_samples)
      fail("--lr-decay-samples/--lr-warmup-samples/--lr-wsd-decay-samples need --train-samples; with --train-iters use the -iters forms");
  } else {
    if (a.lr_decay_iters || a.lr_warmup_iters || a.lr_wsd_decay_iters)
      fail("--lr-decay-iters/--lr-warmup-iters/--lr-wsd-decay-iters need --train-iters; with --train-samples use the -samples forms");
  }
  if (a.lr_warmup_fraction >= 0 && (a.lr_warmup_iters || a.lr_warmup_samples))
    fail("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples cannot be used together");
  validate_float_args(a);
}

void validate_float_args(const Arguments& a) {
  const auto& o = a.optimizer;
  if (!(o.lr > 0.0f)) fail("--lr must be positive (got {})", o.lr);
  at_least_zero("--min-lr", a.min_lr);
  at_least_zero("--lr-warmup-init", a.lr_warmup_init);
  at_least_zero("--clip-grad", a.clip_grad);
  at_least_zero("--weight-decay", o.weight_decay);
  if (a.was_given("--start-weight-decay")) at_least_zero("--start-weight-decay", a.start_weight_decay);
  if (a.was_given("--end-weight-decay")) at_least_zero("--end-weight-decay", a.end_weight_decay);
  if (a.was_given("--lr-warmup-fraction") && !(a.lr_warmup_fraction >= 0.0 && a.lr_warmup_fraction <= 1.0))
    fail("--lr-warmup-fraction must be in [0, 1] (got {})", a.lr_warmup_fraction);
  fraction_below_one("--adam-beta1", o.adam_beta1);
  fraction_below_one("--adam-beta2", o.adam_beta2);
  if (!(o.adam_eps > 0.0f)) fail("--adam-eps must be positive (got {})", o.adam_eps);
  fraction_below_one("--sgd-momentum", o.sgd_momentum);
}

void finish_optimizer_args(Arguments& a) {
  // Loss scaling exists for fp16 only: Megatron ignores these flags in fp32 runs (and would
  // apply --loss-scale to bf16); here they are refused so a forgotten --fp16 shows.
  for (const char* f : {"--loss-scale", "--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis"})
    if (a.was_given(f) && !a.model.fp16) fail("{} needs --fp16 (loss scaling is for fp16 training only)", f);
  if (a.model.fp16) (void)optim::GradScaler(a.grad_scaler);  // names a bad --*loss-scale* / --hysteresis value

  if (a.weight_decay_incr_style == "constant") {
    if (a.start_weight_decay >= 0 || a.end_weight_decay >= 0) {
      if (!(a.start_weight_decay >= 0 && a.end_weight_decay >= 0 && a.start_weight_decay == a.end_weight_decay))
        fail("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine");
    }
    a.start_weight_decay = a.end_weight_decay = a.optimizer.weight_decay;
  } else if (a.start_weight_decay < 0 || a.end_weight_decay < 0) {
    fail("--weight-decay-incr-style {} needs --start-weight-decay and --end-weight-decay", a.weight_decay_incr_style);
  }
}

optim::LRScheduleConfig schedule_config(const OptimizerArgs& o, const TrainingArgs& t) {
  const int64_t gbs = t.global_batch_size;
  optim::LRScheduleConfig lc;
  lc.max_lr = o.optimizer.lr;
  lc.min_lr = o.min_lr;
  lc.decay_style = o.lr_decay_style;
  lc.lr_warmup_init = o.lr_warmup_init;
  lc.wsd_decay_style = o.lr_wsd_decay_style;
  lc.start_wd = o.start_weight_decay;
  lc.end_wd = o.end_weight_decay;
  lc.wd_incr_style = o.weight_decay_incr_style;
  if (o.decoupled_lr >= 0) lc.decoupled_lr = o.decoupled_lr;
  if (o.decoupled_min_lr >= 0) lc.decoupled_min_lr = o.decoupled_min_lr;
  if (t.train_iters > 0) {  // iteration-based: Megatron converts to samples
    int64_t decay_iters = o.lr_decay_iters > 0 ? o.lr_decay_iters : t.train_iters;
    lc.decay_steps = decay_iters * gbs;
    lc.warmup_steps = o.lr_warmup_fraction >= 0
                          ? static_cast<int64_t>(o.lr_warmup_fraction * static_cast<double>(lc.decay_steps))
                          : o.lr_warmup_iters * gbs;
    lc.wsd_decay_steps = o.lr_wsd_decay_iters * gbs;
    lc.wd_incr_steps = t.train_iters * gbs;
  } else {
    lc.decay_steps = o.lr_decay_samples > 0 ? o.lr_decay_samples : t.train_samples;
    lc.warmup_steps = o.lr_warmup_fraction >= 0
                          ? static_cast<int64_t>(o.lr_warmup_fraction * static_cast<double>(lc.decay_steps))
                          : o.lr_warmup_samples;
    lc.wsd_decay_steps = o.lr_wsd_decay_samples;
    lc.wd_incr_steps = t.train_samples;
  }
  return lc;
}

}  // namespace mt
