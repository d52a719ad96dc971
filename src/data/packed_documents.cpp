#include "data/packed_documents.h"
#include <cstddef>

namespace mt::data {

void mark_documents(const std::vector<int32_t>& tokens, int64_t B, int64_t S, int32_t eod, bool reset_positions,
                    bool reset_attention, std::vector<int32_t>& position_ids, std::vector<int32_t>& cu_seqlens) {
  position_ids.clear();
  cu_seqlens.clear();
  if (reset_positions) position_ids.resize(static_cast<size_t>(B * S));
  if (reset_attention) cu_seqlens.push_back(0);
  for (int64_t b = 0; b < B; ++b) {
    int32_t pos = 0;
    for (int64_t t = 0; t < S; ++t) {
      const size_t o = static_cast<size_t>(b * S + t);
      if (reset_positions) position_ids[o] = pos++;
      if (tokens[o] != eod) continue;
      // The EOD belongs to the document it ends; the next token starts the next one.
      pos = 0;
      if (reset_attention && t + 1 < S) cu_seqlens.push_back(static_cast<int32_t>(o + 1));
    }
    if (reset_attention) cu_seqlens.push_back(static_cast<int32_t>((b + 1) * S));
  }
}

}  // namespace mt::data
