#pragma once
// Megatron's masks for packed documents (gpt_dataset.py, _get_ltor_masks_and_position_ids),
// without its S x S mask: a sample of seq_length input tokens may hold several documents, each
// ending with the end-of-document token; the token after an EOD starts a new document.
#include <cstdint>
#include <vector>

namespace mt::data {

// For input tokens [B, S] (sample after sample): with reset_positions, position_ids [B*S] that
// restart at 0 after every EOD (else left empty); with reset_attention, cu_seqlens: the
// document borders over the B*S tokens (0, every sample border, every position after an EOD
// inside a sample, B*S) for attention to keep documents apart (else left empty).
void mark_documents(const std::vector<int32_t>& tokens, int64_t B, int64_t S, int32_t eod, bool reset_positions,
                    bool reset_attention, std::vector<int32_t>& position_ids, std::vector<int32_t>& cu_seqlens);

}  // namespace mt::data
