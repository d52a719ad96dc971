#include "data/mock_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "data/numpy_random.h"

namespace mt::data {

MockLowLevelDataset::MockLowLevelDataset(int32_t eod, int64_t vocab_size) : vocab_(vocab_size) {
  Pcg64 rng(0);  // MockGPTLowLevelDataset.seed
  lengths_ = numpy_integers_int32(rng, 1, kMaxSequenceLength, static_cast<size_t>(kSize));
  max_len_ = *std::max_element(lengths_.begin(), lengths_.end());
  if (eod >= 0) {
    eod_ = eod;
  } else {
    eod_ = vocab_size > 0 ? static_cast<int32_t>(vocab_size - 1) : 0;
  }
  if (vocab_size > 0 && eod_ >= vocab_size) {
    fail("--mock-data: the EOD id {} is outside the vocabulary of {} ids", eod_, vocab_size);
  }
}

void MockLowLevelDataset::read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  const int64_t len = sequence_length(seq);
  MT_CHECK(offset >= 0 && length >= 0 && offset + length <= len, "mock tokens [{}, {}) of {}", offset,
           offset + length, len);
  for (int64_t k = 0; k < length; ++k) {
    const int64_t pos = offset + k;
    int64_t id = pos == len - 1 ? eod_ : pos + 1;
    if (vocab_ > 0 && pos != len - 1) id %= vocab_;
    out[k] = static_cast<int32_t>(id);
  }
}

}  // namespace mt::data
