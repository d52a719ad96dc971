#pragma once
// Added tokens of a tokenizer.json ("added_tokens"): found in the text before normalization
// (or after it, for tokens marked "normalized") and emitted as their own id, never split by the
// model. Matching is leftmost-longest, as HF tokenizers' Aho-Corasick search does.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt::data::hf {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;       // absorb whitespace on the left
  bool rstrip = false;       // absorb whitespace on the right
  bool single_word = false;  // only match where not inside a word
  bool normalized = false;   // matched in normalized text rather than raw text
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `tokens` must outlive the matcher.
  explicit AddedTokenMatcher(std::vector<const AddedToken*> tokens);
  bool empty() const { return tokens_.empty(); }

  struct Segment {
    size_t begin, end;
    const AddedToken* token;  // nullptr: ordinary text
  };
  // Cuts text into ordinary text and added tokens, in order, covering all of it except the
  // whitespace that lstrip/rstrip tokens absorb. Empty text segments are left out.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  int32_t child(int32_t node, unsigned char c) const {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | c);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<const AddedToken*> tokens_;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::vector<const AddedToken*> terminal_;      // per node
  bool first_byte_[256] = {};
};

}  // namespace mt::data::hf
