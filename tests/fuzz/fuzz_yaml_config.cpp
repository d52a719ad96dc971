// `pretrain --config FILE.yaml` with arbitrary bytes as the file, against the real pretrain flag
// table, then validate_args on whatever it accepted (the consumer of the parsed numbers, where an
// overflow would show under UBSan). The only acceptable failure is mt::Error; yaml-cpp's own
// exceptions, a crash, a hang or a sanitizer report are findings.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_util.h"
#include "training/arguments.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_temp("config.yaml", data, size);
  try {
    mt::Arguments a = mt::parse_pretrain_args({"--config", path});
    mt::validate_args(a, 64);
  } catch (const mt::Error&) {
  }
  return 0;
}
