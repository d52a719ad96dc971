// libFuzzer target: the .npy reader (NpyArray::load), as used for --input-ids and for the
// dataset index caches, and element reads that trust its validation.
#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "data/numpy_npy.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_temp("a.npy", data, size);
  try {
    const mt::data::NpyArray a = mt::data::NpyArray::load(path);
    const int64_t n = a.numel();
    uint64_t sum = 0;  // unsigned: the values are arbitrary, their sum may wrap
    for (int64_t i = 0; i < std::min<int64_t>(n, 4096); ++i) sum += static_cast<uint64_t>(a.at(i));
    if (n > 0) sum += static_cast<uint64_t>(a.at(n - 1));
    (void)sum;
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
