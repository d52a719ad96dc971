// Pretrain's training section: batch sizes, length of training, seed, device and threads, and
// the sizes formed from several count flags, checked for overflow.
#include "core/checked.h"
#include "core/error.h"
#include "model/config.h"
#include "training/arguments_sections.h"

namespace mt {

void register_training_flags(FlagParser& p, TrainingArgs& a) {
  p.value("--micro-batch-size", &a.micro_batch_size, "samples per micro-batch", {1, kMaxMicroBatch});
  p.value("--global-batch-size", &a.global_batch_size, "samples per iteration (gradient accumulation)", {1, kMaxGlobalBatch});
  p.value("--train-iters", &a.train_iters, "iterations to train", {1, kMaxSteps});
  p.value("--train-samples", &a.train_samples, "samples to train (instead of --train-iters)", {1, kMaxSteps});
  p.value("--seed", &a.seed, "random seed (default 1234)");
  p.value("--exit-interval", &a.exit_interval, "exit after the iteration divisible by this", {0, INT64_MAX});
  p.value("--device", &a.device, "where to train", {"auto", "cpu", "cuda"});
  p.value("--num-threads", &a.num_threads, "CPU threads (default: all cores)", {0, kMaxThreads});
}

void validate_training_args(Arguments& a) {
  if (a.micro_batch_size <= 0) fail("--micro-batch-size must be positive (got {})", a.micro_batch_size);
  const int64_t per_step = checked_mul(a.micro_batch_size, a.data_parallel_size, "--micro-batch-size x data-parallel size");
  if (a.global_batch_size == 0) a.global_batch_size = per_step;
  if (a.global_batch_size % per_step != 0)
    fail("--global-batch-size ({}) is not divisible by --micro-batch-size ({}) times data-parallel size ({})",
         a.global_batch_size, a.micro_batch_size, a.data_parallel_size);

  if (a.train_iters > 0 && a.train_samples > 0) fail("use only one of --train-iters and --train-samples");
  if (a.train_iters <= 0 && a.train_samples <= 0) fail("set --train-iters or --train-samples");
  // The flag's range already refuses this; a check for Arguments built in code.
  if (a.num_threads < 0) fail("--num-threads must be >= 0 (got {})", a.num_threads);
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
