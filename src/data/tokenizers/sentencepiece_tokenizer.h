#pragma once
// Megatron's SentencePiece-based tokenizers over libsentencepiece (--tokenizer-model x.model):
//  - SentencePieceTokenizer: adds <CLS> <SEP> <EOD> <MASK> (and <PAD>/<BOS>/<EOS> when the
//    model lacks them) after the model's pieces, splits those strings out of the text before
//    encoding, and uses <EOD> as EOD.
//  - GPTSentencePieceTokenizer: the model as is; EOD is the model's eos.
//  - Llama2Tokenizer: as GPTSentencePieceTokenizer, with bos prepended to every text.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace mt::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Flavor { Megatron, Gpt, Llama2 };
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return bos_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override;

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
  std::string decode_plain(const std::vector<int32_t>& ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  Flavor flavor_;
  // Megatron flavor: special strings in the order Megatron tries them (ties go to the first).
  std::vector<std::pair<std::string, int32_t>> specials_;
  int64_t vocab_size_ = 0;
  int32_t eod_ = -1, bos_ = -1, pad_ = -1;
};

}  // namespace mt::data
