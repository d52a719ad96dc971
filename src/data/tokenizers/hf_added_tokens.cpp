#include "data/tokenizers/hf_added_tokens.h"

#include "data/tokenizers/regex.h"
#include "data/tokenizers/utf8.h"

namespace mt::data::hf {

namespace {

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Start of the code point that ends just before byte offset i.
size_t prev_char(std::string_view s, size_t i) {
  do {
    --i;
  } while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

bool is_word_char(std::string_view ch) {
  static const Regex word("^[\\p{L}\\p{N}_]", "single_word");
  bool found = false;
  word.for_each_match(ch, [&](size_t, size_t) { found = true; });
  return found;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens)
    : tokens_(std::move(tokens)) {
  terminal_.push_back(nullptr);  // root
  for (const AddedToken* t : tokens_) {
    if (t->content.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : t->content) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(nullptr);
        edges_.emplace((static_cast<uint64_t>(node) << 8) | c, next);
      }
      node = next;
    }
    // Two tokens with the same content: the later one wins, like a map insert in HF.
    terminal_[node] = t;
    first_byte_[static_cast<unsigned char>(t->content[0])] = true;
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t done = 0;  // end of the last emitted segment
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest token starting at i.
    const AddedToken* best = nullptr;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (terminal_[node]) {
        best = terminal_[node];
        best_end = j + 1;
      }
    }
    if (!best) {
      ++i;
      continue;
    }
    size_t start = i, stop = best_end;
    i = best_end;  // a rejected match is still consumed, as in the Aho-Corasick iteration
    if (best->single_word) {
      const bool left_ok = start == 0 || !is_word_char(text.substr(prev_char(text, start)));
      const bool right_ok = stop == text.size() || !is_word_char(text.substr(stop));
      if (!left_ok || !right_ok) continue;
    }
    if (best->lstrip) {
      while (start > done) {
        const size_t p = prev_char(text, start);
        size_t k = p;
        if (!is_space(utf8::next(text, k))) break;
        start = p;
      }
    }
    if (best->rstrip) {
      while (stop < text.size()) {
        size_t k = stop;
        if (!is_space(utf8::next(text, k))) break;
        stop = k;
      }
      i = stop;
    }
    if (start > done) out.push_back({done, start, nullptr});
    out.push_back({start, stop, best});
    done = stop;
  }
  if (done < text.size()) out.push_back({done, text.size(), nullptr});
}

}  // namespace mt::data::hf
