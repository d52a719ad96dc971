#include "core/version.h"

#include <fmt/format.h>

// Set for this file only (CMakeLists.txt), so a new commit recompiles one file.
#ifndef MT_VERSION
#define MT_VERSION "0.0.0"
#endif
#ifndef MT_GIT_COMMIT
#define MT_GIT_COMMIT "unknown"
#endif

namespace mt {

std::string megatron_version() { return fmt::format("megatron.cpp {} (git {})", MT_VERSION, MT_GIT_COMMIT); }

}  // namespace mt
