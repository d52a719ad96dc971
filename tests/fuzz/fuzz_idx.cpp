// libFuzzer target: Megatron's .idx index reader (IndexedDataset), with a .bin beside it, and
// the token reads that trust the validated index. The first input byte says how many of the
// last bytes form the .bin; the bytes between are the .idx.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t bin_len = std::min<size_t>(data[0], size - 1);
  const size_t idx_len = size - 1 - bin_len;
  mt::fuzz::write_temp("ds.idx", data + 1, idx_len);
  mt::fuzz::write_temp("ds.bin", data + 1 + idx_len, bin_len);
  try {
    static const std::string prefix = mt::fuzz::temp_dir() + "/ds";
    mt::data::IndexedDataset ds(prefix);
    // Everything below relies on validate(): any out-of-bounds read here is a finding.
    (void)ds.sequence_lengths();
    for (int64_t d = 0; d < ds.num_documents(); ++d) (void)ds.document_bound(d + 1);
    std::vector<int32_t> buf;
    for (int64_t s = 0; s < std::min<int64_t>(ds.num_sequences(), 64); ++s) {
      const int32_t len = ds.sequence_length(s);
      (void)ds.get(s);
      buf.resize(static_cast<size_t>(len));
      if (len > 1) ds.read(s, 1, len - 1, buf.data());
    }
  } catch (const mt::Error&) {
    // A clean refusal.
  }
  return 0;
}
