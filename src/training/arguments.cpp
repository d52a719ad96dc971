// Pretrain's arguments as a whole: every section's flags in one parser, and Megatron's
// validate_args as the sections' checks in a fixed order (the order users have always seen the
// errors in). The sections themselves are in arguments_<section>.cpp.
#include "training/arguments.h"

#include <algorithm>

#include "core/error.h"
#include "model/gpt_model.h"
#include "training/arguments_sections.h"
#include "training/batch_schedule.h"
#include "training/flag_parser.h"
#include "training/megatron_flags.h"

namespace mt {
namespace {

struct Registered {
  explicit Registered(const std::string& command = "pretrain") : parser(command) {}
  FlagParser parser;
  ModelAliases model_aliases;
};

// --help lists the sections under Megatron's argument groups, in its order.
void register_flags(Registered& r, Arguments& a) {
  FlagParser& p = r.parser;
  p.group("model");
  register_model_flags(p, a, r.model_aliases);
  p.group("mixture of experts");
  register_moe_flags(p, a.model.moe, a);
  register_fp8_flags(p, a.model.fp8);
  p.group("training");
  register_training_flags(p, a);
  p.group("learning rate and optimizer");
  register_optimizer_flags(p, a);
  register_lr_group_flags(p, a);
  p.group("checkpointing");
  register_checkpoint_flags(p, a);
  p.group("distributed");
  register_parallel_flags(p, a);
  register_context_flags(p, a);
  p.group("data and tokenizer");
  register_data_flags(p, a);
  register_tiktoken_flags(p, a.tokenizer);
  p.group("logging and evaluation");
  register_logging_flags(p, a);
  register_ops_flags(p, a);
  register_run_flags(p, a);
  p.group("profiling");
  register_profile_flags(p, a);
  register_megatron_table(p);
  p.enable_config();
}

}  // namespace

bool Arguments::was_given(const char* flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }

Arguments parse_pretrain_args(const std::vector<std::string>& argv) { return parse_pretrain_args(argv, "pretrain", {}); }

Arguments parse_pretrain_args(const std::vector<std::string>& argv, const std::string& command,
                              const ExtraFlags& extra) {
  Arguments a;
  Registered r(command);
  register_flags(r, a);
  if (extra) extra(r.parser);
  r.parser.parse(argv);
  if (r.parser.help_requested()) throw Error("help:" + r.parser.help());
  a.given = r.parser.given_names();
  resolve_model_aliases(a, r.model_aliases);
  return a;
}

std::string pretrain_help(const std::string& command, const ExtraFlags& extra) {
  Arguments a;
  Registered r(command);
  register_flags(r, a);
  if (extra) extra(r.parser);
  return r.parser.help();
}

std::vector<std::string> pretrain_flag_names() {
  Arguments a;
  Registered r;
  register_flags(r, a);
  return r.parser.registered_names();
}

std::vector<FlagParser::Current> pretrain_current_values(const Arguments& a) {
  Arguments copy = a;  // registration binds the parser to the fields it reads
  Registered r;
  register_flags(r, copy);
  // The alias switches as the resolved model has them (the others' meaning is in the fields they set).
  r.model_aliases.disable_bias_linear = !a.model.add_bias_linear;
  r.model_aliases.add_qkv_bias = a.model.add_qkv_bias && !a.model.add_bias_linear;
  return r.parser.current_values();
}

std::vector<std::string> pretrain_rejected_registered() {
  Arguments a;
  Registered r;
  register_flags(r, a);
  std::vector<std::string> both;
  for (const auto& n : r.parser.registered_names())
    if (r.parser.rejected(n)) both.push_back(n);
  return both;
}

void validate_args(Arguments& a, int64_t tokenizer_vocab_size) {
  validate_parallel_args(a);
  validate_context_args(a);
  validate_moe_args(a);
  validate_model_args(a);
  validate_batch_schedule_args(a);  // may set the global batch size, which the batch checks need
  validate_training_args(a);
  validate_optimizer_args(a);
  validate_logging_args(a);
  validate_checkpoint_args(a);
  validate_ops_args(a);
  finish_optimizer_args(a);
  validate_lr_group_args(a);
  validate_data_args(a);
  validate_tiktoken_args(a);
  finish_model_args(a, tokenizer_vocab_size);
  validate_size_products(a);
  if (a.tensor_model_parallel_size > 1)
    model::check_tensor_parallel(a.model, a.tensor_model_parallel_size, a.sequence_parallel);
  validate_pipeline_args(a);
  validate_recompute_args(a);
  validate_run_args(a);
  validate_profile_args(a);
  validate_fp8_args(a);
}

}  // namespace mt
