#pragma once
// The run's resolved arguments as data: every bound pretrain flag after validation and defaults,
// under Megatron's argument names (--num-layers -> num_layers), with the derived sizes and the
// binary's version. --print-config prints it; every checkpoint stores it (state.json
// args.run_args); --use-checkpoint-args reads the model and tokenizer back from it.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "training/arguments.h"

namespace mt {

nlohmann::json resolved_arguments(const Arguments& a);

// --use-checkpoint-args: the flags (as command-line words) that restore the model shape and the
// tokenizer of the checkpoint in --load, leaving out those given in `argv`. The tokenizer files
// are the checkpoint's own copies. `given`: the arguments as parsed from the command line.
std::vector<std::string> checkpoint_arg_words(const Arguments& given);

}  // namespace mt
