#include "training/commands.h"

#include "core/error.h"
#include "data/preprocess.h"
#include "training/megatron_flags.h"
#include "training/suggest.h"

namespace mt {

int run_command(const std::string& cmd, const std::vector<std::string>& args) {
  if (cmd == "pretrain") return pretrain_main(args);
  if (cmd == "generate") return generate_main(args);
  if (cmd == "preprocess") return data::preprocess_main(args);
  if (cmd == "launch") return launch_main(args);
  if (cmd == "convert") return convert_main(args);
  if (cmd == "logits") return logits_main(args);
  if (cmd == "estimate") return estimate_main(args);
  if (cmd == "flags") return flags_main(args);
  if (cmd == "inspect-data") return inspect_data_main(args);
  if (cmd == "serve") return serve_main(args);
  static const std::vector<std::string> known = {"pretrain", "generate", "preprocess",   "launch", "convert",
                                                 "logits",   "estimate", "inspect-data", "flags",
                                                 "serve"};
  std::string s = closest_match(cmd, known);
  fail("unknown command '{}'{}; run 'megatron --help' for the list", cmd,
       s.empty() ? "" : " (did you mean '" + s + "'?)");
}

}  // namespace mt
