#include "data/tokenizers/null_tokenizer.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "core/error.h"

namespace mt::data {

NullTokenizer::NullTokenizer(int64_t vocab_size) : vocab_size_(vocab_size) {
  if (vocab_size <= 0 || vocab_size >= std::numeric_limits<int32_t>::max()) {
    fail("--vocab-size must be a positive integer below 2^31 for --tokenizer-type NullTokenizer "
         "(got {})", vocab_size);
  }
}

std::vector<int32_t> NullTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t i = 0;
  const size_t n = text.size();
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  while (i < n) {
    while (i < n && is_space(text[i])) ++i;
    if (i == n) break;
    size_t j = i;
    while (j < n && !is_space(text[j])) ++j;
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, v);
    if (ec != std::errc() || end != text.data() + j || v < 0 || v > vocab_size_) {
      fail("NullTokenizer: '{}' is not a token id in [0, {}]; with --tokenizer-type NullTokenizer "
           "the text must be whitespace-separated integers",
           text.substr(i, std::min<size_t>(j - i, 32)), vocab_size_);
    }
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

std::string NullTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out.push_back(' ');
    out += std::to_string(ids[k]);
  }
  return out;
}

}  // namespace mt::data
