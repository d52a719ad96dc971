#pragma once
// Tokenizers selected by Megatron's --tokenizer-type. Implementations live in src/data/tokenizers/.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mt::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Vocabulary size before Megatron's padding (what Megatron's tokenizer.vocab_size returns).
  virtual int64_t vocab_size() const = 0;
  // Special ids as Megatron defines them for this tokenizer type; -1 when there is none.
  virtual int32_t eod() const = 0;
  virtual int32_t bos() const { return -1; }
  virtual int32_t pad() const { return -1; }
  virtual std::string name() const = 0;
};

struct TokenizerOptions {
  std::string type;             // --tokenizer-type
  std::string vocab_file;       // --vocab-file
  std::string merge_file;       // --merge-file
  std::string tokenizer_model;  // --tokenizer-model
  int64_t vocab_size = 0;       // --vocab-size (NullTokenizer; TikTokenizer: 0 is Megatron's 131072)
  // TikTokenizer (data/tokenizers/tiktoken_tokenizer.h).
  std::string tiktoken_pattern;                 // --tiktoken-pattern v1|v2 (empty: v2)
  int64_t tiktoken_num_special_tokens = 1000;   // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;      // --tokenizer-special-tokens
};

// Throws mt::Error naming the flag or file on bad input.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& opts);

}  // namespace mt::data
