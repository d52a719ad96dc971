// libFuzzer target: preprocess's .jsonl.zst input (ZstdReader through LineReader): zstd frames
// of any shape, truncated or corrupt, must come out as lines or as a clean mt::Error.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/preprocess_input.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_temp("in.jsonl.zst", data, size);
  try {
    mt::data::LineReader r(path);
    std::string line;
    size_t total = 0;
    // Bounded: a tiny frame can expand a lot; 64 MiB of lines is enough to exercise the reader.
    while (total < (64u << 20) && r.next(line)) total += line.size() + 1;
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
