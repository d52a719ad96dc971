// Part of validate_args: the ranges of the float flags and the products of the count flags.
// The parser already refuses inf, nan and numbers out of each flag's own range; what is left
// are ranges that depend on the flag's meaning (a beta in [0, 1)) and sizes formed from several
// flags (samples = iterations x global batch), which must not wrap.
#include <algorithm>
#include <string>

#include "core/checked.h"
#include "core/error.h"
#include "training/arguments.h"

namespace mt {
namespace {

bool was_given(const Arguments& a, const char* flag) {
  return std::find(a.given.begin(), a.given.end(), flag) != a.given.end();
}

// Each check is written as "not in the good range", so a NaN (from anywhere) fails it too.
void at_least_zero(const char* flag, double v) {
  if (!(v >= 0.0)) fail("{} must be >= 0 (got {})", flag, v);
}

void fraction_below_one(const char* flag, double v) {
  if (!(v >= 0.0 && v < 1.0)) fail("{} must be in [0, 1) (got {})", flag, v);
}

}  // namespace

void validate_float_args(const Arguments& a) {
  const auto& o = a.optimizer;
  if (!(o.lr > 0.0f)) fail("--lr must be positive (got {})", o.lr);
  at_least_zero("--min-lr", a.min_lr);
  at_least_zero("--lr-warmup-init", a.lr_warmup_init);
  at_least_zero("--clip-grad", a.clip_grad);
  at_least_zero("--weight-decay", o.weight_decay);
  if (was_given(a, "--start-weight-decay")) at_least_zero("--start-weight-decay", a.start_weight_decay);
  if (was_given(a, "--end-weight-decay")) at_least_zero("--end-weight-decay", a.end_weight_decay);
  if (was_given(a, "--lr-warmup-fraction") && !(a.lr_warmup_fraction >= 0.0 && a.lr_warmup_fraction <= 1.0))
    fail("--lr-warmup-fraction must be in [0, 1] (got {})", a.lr_warmup_fraction);
  fraction_below_one("--adam-beta1", o.adam_beta1);
  fraction_below_one("--adam-beta2", o.adam_beta2);
  if (!(o.adam_eps > 0.0f)) fail("--adam-eps must be positive (got {})", o.adam_eps);
  fraction_below_one("--sgd-momentum", o.sgd_momentum);
}

void validate_size_products(const Arguments& a) {
  const int64_t gbs = a.global_batch_size;
  // One micro-batch's tokens are the rows of every GEMM, a BLAS int.
  const int64_t tokens = checked_mul(a.micro_batch_size, a.model.seq_length, "--micro-batch-size x --seq-length");
  if (tokens > model::limits::kBlasDim)
    fail("--micro-batch-size {} x --seq-length {} = {} tokens per micro-batch; at most {} fit one GEMM: use a "
         "smaller micro-batch",
         a.micro_batch_size, a.model.seq_length, tokens, model::limits::kBlasDim);
  // The sample counts the schedule and the datasets are built from (Trainer, build_gpt_datasets).
  if (a.train_iters > 0) {
    const int64_t iters = a.train_iters;
    (void)checked_mul(iters, gbs, "--train-iters x --global-batch-size (training samples)");
    (void)checked_mul(a.lr_decay_iters, gbs, "--lr-decay-iters x --global-batch-size");
    (void)checked_mul(a.lr_warmup_iters, gbs, "--lr-warmup-iters x --global-batch-size");
    (void)checked_mul(a.lr_wsd_decay_iters, gbs, "--lr-wsd-decay-iters x --global-batch-size");
    if (a.eval_iters > 0) {
      const int64_t evals = iters / a.eval_interval + 2;
      (void)checked_mul(checked_mul(evals, a.eval_iters, "--eval-iters x evaluations"), gbs,
                        "--eval-iters x evaluations x --global-batch-size (validation samples)");
    }
  } else if (a.eval_iters > 0) {
    const int64_t evals = a.train_samples / gbs / a.eval_interval + 2;
    (void)checked_mul(checked_mul(evals, a.eval_iters, "--eval-iters x evaluations"), gbs,
                      "--eval-iters x evaluations x --global-batch-size (validation samples)");
  }
}

}  // namespace mt
