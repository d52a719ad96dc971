#pragma once
// HF tokenizers decoders (tokenizer.json "decoder"): turn the token strings of a sequence of ids
// back into text. Each decoder maps a list of strings to a list of strings, as in HF.
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizers/hf_json.h"

namespace mt::data::hf {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for a null decoder (tokens are then joined with spaces). Supports ByteLevel,
// Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const Where& w);

}  // namespace mt::data::hf
