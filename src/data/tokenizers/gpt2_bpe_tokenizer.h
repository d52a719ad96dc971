#pragma once
// Megatron's GPT2BPETokenizer: GPT-2's byte-level BPE from --vocab-file (encoder.json) and
// --merge-file (vocab.bpe). No special tokens are split out of the text ("<|endoftext|>" in a
// document is encoded as ordinary text); EOD is the id of <|endoftext|>.
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/regex.h"

namespace mt::data {

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

 private:
  std::vector<std::string> id_to_token_;  // as spelled in encoder.json (byte-level characters)
  std::unique_ptr<Bpe> bpe_;
  std::unique_ptr<Regex> pattern_;
  int32_t eod_ = -1;
};

// GPT-2's pre-tokenization pattern.
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace mt::data
