#include "core/error.h"
#include "data/preprocess.h"
namespace mt::data {
int preprocess_main(const std::vector<std::string>&) { fail("preprocess: not built yet"); }
}  // namespace mt::data
