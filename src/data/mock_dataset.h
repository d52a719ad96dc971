#pragma once
// Megatron's MockGPTLowLevelDataset (--mock-data): 100000 documents whose lengths come from
// numpy.random.default_rng(0).integers(1, 4096), document i holding tokens 1, 2, ..., L-1, EOD.
// A GPTDataset over it therefore yields the very samples Megatron's MockGPTDataset yields.
#include <cstdint>
#include <vector>

#include "data/gpt_dataset.h"

namespace mt::data {

class MockLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr int64_t kSize = 100000;
  static constexpr int64_t kMaxSequenceLength = 4096;

  // vocab_size > 0 folds token ids into [0, vocab_size) so a small test vocabulary stays valid
  // (Megatron does not fold; ids then reach 4094). eod < 0 picks vocab_size - 1 (or 0).
  MockLowLevelDataset(int32_t eod, int64_t vocab_size);

  int64_t num_sequences() const override { return kSize; }
  int32_t sequence_length(int64_t i) const override { return lengths_[static_cast<size_t>(i)]; }
  int32_t max_sequence_length() const override { return max_len_; }
  void read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override;

 private:
  std::vector<int32_t> lengths_;
  int32_t max_len_ = 0;
  int32_t eod_;
  int64_t vocab_;
};

}  // namespace mt::data
