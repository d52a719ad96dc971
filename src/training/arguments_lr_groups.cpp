// Pretrain's learning-rate groups: Megatron's --decoupled-lr / --decoupled-min-lr give the word
// embedding and the output layer (its is_embedding_or_output_parameter) their own max_lr and min_lr
// under the same schedule (optim::LRSchedule::decoupled_lr; the parameters are marked in
// model::GPTModel, the groups stepped in optim::AdamW / optim::SGD).
#include "core/error.h"
#include "optim/lr_schedule.h"
#include "training/arguments_sections.h"

namespace mt {

void register_lr_group_flags(FlagParser& p, OptimizerArgs& a) {
  p.value("--decoupled-lr", &a.decoupled_lr,
          "peak learning rate of the word embedding and output layer (default: --lr, one group)");
  p.value("--decoupled-min-lr", &a.decoupled_min_lr,
          "minimum learning rate of the word embedding and output layer (default --min-lr)");
}

void validate_lr_group_args(const Arguments& a) {
  // -1 is "unset"; a given value is a rate.
  for (auto [flag, v] : {std::pair{"--decoupled-lr", a.decoupled_lr}, std::pair{"--decoupled-min-lr", a.decoupled_min_lr}})
    if (a.was_given(flag) && !(v >= 0.0)) fail("{} must be >= 0 (got {})", flag, v);
  // The schedule checks the two against each other and against --min-lr, naming the flags.
  if (a.was_given("--decoupled-lr") || a.was_given("--decoupled-min-lr")) (void)optim::LRSchedule(schedule_config(a, a));
}

}  // namespace mt
