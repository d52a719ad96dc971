#pragma once
// The BPE model shared by GPT2BPETokenizer and HuggingFaceTokenizer: a vocabulary, a ranked list
// of merges, and the merge loop applied to one pre-token at a time.
//
// The model works in its input alphabet: for byte-level vocabularies the caller converts tokens
// to raw bytes first and sets `byte_units`, so a word is split into bytes; otherwise a word is
// split into code points. Merges are applied lowest rank first, leftmost first among equal ranks
// (what HF tokenizers, transformers.js and GPT-2's loop all produce).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizers/word_cache.h"

namespace mt::data {

struct BpeOptions {
  bool byte_units = false;     // split words into bytes (byte-level vocabularies) not code points
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  bool ignore_merges = false;  // a word found whole in the vocabulary is one token (Llama-3)
  bool fuse_unk = false;       // consecutive unknown characters become one unk token
  int32_t unk_id = -1;         // -1: no unk token (an unknown character is then an error)
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using VocabMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // `what` names the file for error messages. Merges whose parts or result are not in the
  // vocabulary are an error, as in HF tokenizers.
  Bpe(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions opts, std::string_view what);

  // Appends the ids of one pre-token. Thread-safe.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // Enables cutting long pre-tokens before U+2581 (SentencePiece's space) where no vocabulary
  // token spans the cut: BPE never merges across such a cut, so the parts can be encoded (and
  // cached) separately with the same result. Tokenizers converted from SentencePiece have no
  // pre-tokenizer, so without this every document would be one uncached word.
  void enable_metaspace_cuts();

  const VocabMap& vocab() const { return vocab_; }
  int32_t find(std::string_view token) const {
    auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void encode_part(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  void unknown(std::string_view ch, std::vector<int32_t>& out, bool& last_unk) const;

  VocabMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions opts_;
  std::string what_;
  int32_t byte_token_[256];  // ids of <0xXX>, -1 where absent
  int32_t unit_id_[256];     // byte units: id of each single byte, -1 where absent
  // Code-point units: id of each single-character token (the common initial lookups).
  std::unordered_map<char32_t, int32_t> char_id_;
  WordCache cache_;
  bool metaspace_cuts_ = false;
  std::unordered_map<char32_t, bool> glued_to_metaspace_;  // chars some token has before U+2581
};

}  // namespace mt::data
