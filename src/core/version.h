#pragma once
// The binary's version, as `megatron --version` prints it and checkpoints record it: the project
// version and the git commit the build was configured at ("unknown" outside a git checkout).
#include <string>

namespace mt {

std::string megatron_version();

}  // namespace mt
