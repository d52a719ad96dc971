#include "core/error.h"
#include "training/commands.h"
namespace mt {
int pretrain_main(const std::vector<std::string>&) { fail("pretrain: not built yet"); }
int generate_main(const std::vector<std::string>&) { fail("generate: not built yet"); }
}  // namespace mt
