// Pretrain's arguments as a whole: every section's flags in one parser, and Megatron's
// validate_args as the sections' checks in a fixed order (the order users have always seen the
// errors in). The sections themselves are in arguments_<section>.cpp.
#include "training/arguments.h"

#include <algorithm>

#include "core/error.h"
#include "model/gpt_model.h"
#include "training/arguments_sections.h"
#include "training/flag_parser.h"

namespace mt {
namespace {

struct Registered {
  FlagParser parser{"pretrain"};
  ModelAliases model_aliases;
};

void register_flags(Registered& r, Arguments& a) {
  FlagParser& p = r.parser;
  register_model_flags(p, a, r.model_aliases);
  register_moe_flags(p, a.model.moe, a);
  register_data_flags(p, a);
  register_training_flags(p, a);
  register_optimizer_flags(p, a);
  register_logging_flags(p, a);
  register_checkpoint_flags(p, a);
  register_parallel_flags(p, a);
  register_context_flags(p, a);
  p.enable_config();
}

}  // namespace

bool Arguments::was_given(const char* flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }

Arguments parse_pretrain_args(const std::vector<std::string>& argv) {
  Arguments a;
  Registered r;
  register_flags(r, a);
  r.parser.parse(argv);
  if (r.parser.help_requested()) throw Error("help:" + r.parser.help());
  a.given = r.parser.given_names();
  resolve_model_aliases(a, r.model_aliases);
  return a;
}

std::string pretrain_help() {
  Arguments a;
  Registered r;
  register_flags(r, a);
  return r.parser.help();
}

void validate_args(Arguments& a, int64_t tokenizer_vocab_size) {
  validate_parallel_args(a);
  validate_context_args(a);
  validate_moe_args(a);
  validate_model_args(a);
  validate_training_args(a);
  validate_optimizer_args(a);
  validate_logging_args(a);
  validate_checkpoint_args(a);
  finish_optimizer_args(a);
  validate_data_args(a);
  finish_model_args(a, tokenizer_vocab_size);
  validate_size_products(a);
  if (a.tensor_model_parallel_size > 1)
    model::check_tensor_parallel(a.model, a.tensor_model_parallel_size, a.sequence_parallel);
  validate_pipeline_args(a);
  validate_recompute_args(a);
}

}  // namespace mt
