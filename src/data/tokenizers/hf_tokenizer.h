#pragma once
// Megatron's HuggingFaceTokenizer, without Python: reads a tokenizer.json (BPE models) and its
// tokenizer_config.json and reproduces what `AutoTokenizer.from_pretrained(path)` does on
// `tokenizer(text).input_ids` (special tokens of the post-processor included, as Megatron calls
// it) and on `decode(ids)`.
//
// Pipeline per text: added tokens split out of the raw text -> normalizer -> pre-tokenizer ->
// BPE per piece -> post-processor's special tokens around the whole.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/hf_added_tokens.h"
#include "data/tokenizers/hf_decoder.h"
#include "data/tokenizers/hf_normalizer.h"
#include "data/tokenizers/hf_pre_tokenizer.h"

namespace mt::data {

class HfTokenizer final : public Tokenizer {
 public:
  // `path`: a tokenizer.json file or a directory holding one (with tokenizer_config.json).
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t eod() const override { return eos_; }
  int32_t bos() const override { return bos_; }
  int32_t pad() const override { return pad_; }
  std::string name() const override { return "HuggingFaceTokenizer"; }

  // Encodes without the post-processor's special tokens (add_special_tokens=False).
  std::vector<int32_t> encode_plain(std::string_view text) const;
  // Decodes without the clean-up of tokenization spaces, whatever the config says.
  std::string decode_raw(const std::vector<int32_t>& ids) const;

 private:
  void load(const std::string& path);
  void load_model(const nlohmann::json& model, const std::string& file);
  void load_post_processor(const nlohmann::json& j, const std::string& file);
  void load_config(const std::string& dir);
  int32_t token_id(const std::string& token) const;
  void encode_section(std::string_view text, bool first, std::vector<int32_t>& ids) const;

  std::unique_ptr<hf::Normalizer> normalizer_;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer_;
  std::unique_ptr<hf::Decoder> decoder_;
  std::unique_ptr<Bpe> bpe_;
  std::vector<hf::AddedToken> added_;
  hf::AddedTokenMatcher raw_matcher_;         // added tokens matched in the raw text
  hf::AddedTokenMatcher normalized_matcher_;  // those marked "normalized"
  std::vector<hf::AddedToken> normalized_forms_;  // their contents after normalization
  // Model vocabulary and added tokens. A map, as in HF tokenizers: ids need not be dense, and a
  // file naming one id near 2^31 must not make us allocate a table that large.
  std::unordered_map<int32_t, std::string> id_to_token_;
  VocabMap token_to_id_;                     // same, as HF's token_to_id sees it
  std::vector<int32_t> prefix_, suffix_;     // post-processor's special tokens
  bool clean_up_spaces_ = false;
  int64_t vocab_size_ = 0;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
};

}  // namespace mt::data
