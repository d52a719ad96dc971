#pragma once
// Megatron's TikTokenizer (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py): byte-level
// BPE by ranks, as tiktoken runs it, over a JSON vocabulary (--tokenizer-model: a list of
// {rank, token_bytes (base64), token_str}, the 256 single bytes first). The first
// --tiktoken-num-special-tokens ids are special tokens (--tokenizer-special-tokens, which must
// include <unk> <s> </s> <mask> <pad> <cls> <sep>, then <SPECIAL_i> fillers); every vocabulary rank
// is offset by their number. The file is cut to --vocab-size minus that number of entries.
// Special tokens written in the text are encoded as their ids (tiktoken's allowed_special="all").
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/regex.h"

namespace mt::data {

struct TikTokenOptions {
  std::string pattern = "v2";                   // --tiktoken-pattern v1|v2
  int64_t num_special_tokens = 1000;            // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;      // --tokenizer-special-tokens (empty: Megatron's seven)
  int64_t vocab_size = int64_t{1} << 17;        // --vocab-size (Megatron's default 131072)
};

class TikTokenizer final : public Tokenizer {
 public:
  TikTokenizer(const std::string& path, const TikTokenOptions& o);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eos_; }  // Megatron: eod is eos, "</s>"
  int32_t bos() const override { return bos_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override { return "TikTokenizer"; }

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t rank_of(std::string_view bytes) const;

  VocabMap ranks_;                  // token bytes -> id (rank + number of special tokens)
  std::vector<std::string> bytes_;  // id - number of special tokens -> token bytes
  std::vector<std::string> special_;
  VocabMap special_ids_;                 // special token -> id
  std::vector<size_t> special_lengths_;  // their distinct lengths, longest first
  bool special_first_[256] = {};         // bytes a special token starts with
  std::unique_ptr<Regex> pattern_;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
};

// Megatron's two pre-tokenization patterns.
inline constexpr const char* kTikTokenPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
inline constexpr const char* kTikTokenPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace mt::data
