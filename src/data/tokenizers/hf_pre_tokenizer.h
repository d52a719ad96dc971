#pragma once
// HF tokenizers pre-tokenizers (tokenizer.json "pre_tokenizer"): cut normalized text into the
// pieces the model encodes one at a time. Pieces are byte ranges into one buffer so that the
// common splitting pre-tokenizers copy nothing.
//
// ByteLevel's byte-to-character mapping is not done here: byte-level models are converted to raw
// bytes at load time (see hf_tokenizer.cpp), so pieces stay raw UTF-8 throughout.
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizers/hf_json.h"

namespace mt::data::hf {

struct Piece {
  size_t begin, end;
};

struct PreTokenized {
  std::string buf;
  std::vector<Piece> pieces;
  bool first_section = true;  // the text starts the whole input (Metaspace "first")
  std::string_view piece(size_t i) const {
    return std::string_view(buf).substr(pieces[i].begin, pieces[i].end - pieces[i].begin);
  }
};

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void apply(PreTokenized& pt) const = 0;
  // True for ByteLevel (and a Sequence ending in it): the model's vocabulary is byte-level.
  virtual bool byte_level() const { return false; }
};

// nullptr for a null pre-tokenizer. Supports Sequence, ByteLevel, Split, Metaspace, Digits,
// Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, CharDelimiterSplit.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const Where& w);

}  // namespace mt::data::hf
