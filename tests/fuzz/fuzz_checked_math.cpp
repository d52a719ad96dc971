// Exercises core/checked.h with arbitrary factors: it must either return the exact product or
// throw mt::Error, never overflow silently (UBSan would report signed overflow).
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/checked.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<int64_t> dims(size / 8);
  if (!dims.empty()) std::memcpy(dims.data(), data, dims.size() * 8);
  // The model: multiply in order; a negative factor or a partial product beyond int64 is an error.
  bool expect_error = false;
  __int128 exact = 1;
  for (int64_t d : dims) {
    if (d < 0) { expect_error = true; break; }
    exact *= d;  // both factors < 2^63: fits in 128 bits
    if (exact > INT64_MAX) { expect_error = true; break; }
  }
  try {
    int64_t p = mt::checked_product(dims, "fuzz");
    if (expect_error || exact != p) __builtin_trap();
  } catch (const mt::Error&) {
    if (!expect_error) __builtin_trap();
  }
  return 0;
}
