#pragma once
// Megatron's NullTokenizer: the text already is token ids, written as whitespace-separated
// integers. Used for synthetic data and benchmarks; EOD is the id just past the vocabulary.
#include <cstdint>

#include "data/tokenizer.h"

namespace mt::data {

class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // Megatron reports vocab_size + 1 so the EOD id is inside the embedding table.
  int64_t vocab_size() const override { return vocab_size_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_); }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t vocab_size_;
};

}  // namespace mt::data
