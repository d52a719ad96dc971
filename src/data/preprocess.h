#pragma once
#include <string>
#include <vector>

namespace mt::data {
// `megatron preprocess ...` (tools/preprocess_data.py's flags). args excludes the subcommand.
// Returns the process exit code; throws mt::Error for user mistakes.
int preprocess_main(const std::vector<std::string>& args);
}  // namespace mt::data
