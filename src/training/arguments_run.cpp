// Pretrain's run section: what happens around the training loop. Evaluation-only runs
// (--skip-train), what a missing checkpoint means (--exit-on-missing-checkpoint), the order the
// training samples are read in (--dataloader-type), and --print-config / --dry-run.
#include "core/error.h"
#include "training/arguments_sections.h"

namespace mt {

void register_run_flags(FlagParser& p, RunArgs& a) {
  p.group("training");
  p.store_true("--skip-train", &a.skip_train,
               "no training: load --load, evaluate the validation and test splits, and exit");
  p.custom("--dataloader-type", true,
           [&a](const std::string& v) {
             if (v == "external")
               fail("--dataloader-type external: megatron.cpp reads Megatron's datasets itself; use single or cyclic");
             if (v != "single" && v != "cyclic") fail("--dataloader-type got '{}'; expected single or cyclic", v);
             a.dataloader_type = v;
           },
           "single: the dataset's own (shuffled) sample order, read once (default); cyclic: a fresh random "
           "permutation of the samples every epoch");
  p.list("--rampup-batch-size", &a.rampup_batch_size,
         "START INCREMENT SAMPLES: the global batch grows from START by INCREMENT, linearly over SAMPLES samples, "
         "to --global-batch-size (Megatron's ramp-up)");
  // Taken as one or several words: Megatron's own GPT-3 example passes the schedule through an
  // unquoted array expansion, which splits it at the spaces.
  p.custom_list("--step-batch-size-schedule",
                [&a](const std::vector<std::string>& words) {
                  a.step_batch_size_schedule.clear();
                  for (const auto& w : words) a.step_batch_size_schedule += (a.step_batch_size_schedule.empty() ? "" : " ") + w;
                },
                "THRESHOLD:BS ...: global batch size BS from THRESHOLD tokens on (K/M/B/T suffixes), as Megatron 0.20");
  p.store_true("--print-config", &a.print_config,
               "megatron.cpp: print every resolved argument (after validation and defaults) as JSON and exit");
  p.custom("--dry-run", false, [&a](const std::string&) { a.print_config = true; },
           "megatron.cpp: same as --print-config");
  p.group("checkpointing");
  p.store_true("--use-checkpoint-args", &a.use_checkpoint_args,
               "take the model shape and the tokenizer (its files are in the checkpoint) from --load's checkpoint; "
               "flags given here still win");
  p.store_true("--exit-on-missing-checkpoint", &a.exit_on_missing_checkpoint,
               "with --load: stop with an error when it holds no checkpoint, instead of training from scratch");
}

void validate_run_args(const Arguments& a) {
  if (a.exit_on_missing_checkpoint && a.load.empty())
    fail("--exit-on-missing-checkpoint needs --load DIR (the checkpoint that must exist)");
  if (a.use_checkpoint_args && a.load.empty()) fail("--use-checkpoint-args needs --load DIR (the checkpoint to read)");
  if (a.skip_train && a.eval_iters == 0)
    fail("--skip-train evaluates and exits, but --eval-iters is 0: give --eval-iters N");
}

}  // namespace mt
