#pragma once
// HF tokenizers normalizers (tokenizer.json "normalizer"): applied to each piece of text between
// added tokens, before pre-tokenization.
#include <memory>
#include <string>

#include "data/tokenizers/hf_json.h"

namespace mt::data::hf {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// nullptr for a null normalizer. Supports Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// StripAccents, Prepend, Replace; anything else is an error naming the type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const Where& w);

}  // namespace mt::data::hf
