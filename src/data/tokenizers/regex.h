#pragma once
// PCRE2 (UTF + Unicode properties, JIT when available) for the pre-tokenizer patterns that
// tokenizer files carry. Patterns are written for Oniguruma (HF tokenizers) or Python's `regex`
// (GPT-2); the few escapes whose meaning differs in PCRE2 are rewritten on the way in.
// A compiled Regex is immutable and may be used from many threads at once.
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace mt::data {

class Regex {
 public:
  // `what` names the pattern's origin (file and field) for the error message.
  Regex(std::string_view pattern, std::string_view what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end) for each non-empty match, left to right, in the valid UTF-8 text.
  template <typename Fn>
  void for_each_match(std::string_view text, Fn&& fn) const {
    size_t pos = 0, b = 0, e = 0;
    while (find(text, pos, b, e)) {
      fn(b, e);
      pos = e;
    }
  }

  // Replaces every match with `with` (a literal, no group references).
  std::string replace_all(std::string_view text, std::string_view with) const;

  const std::string& pattern() const { return source_; }

 private:
  // Finds the next non-empty match at or after `from`.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end) const;

  std::string source_;
  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
};

// Rewrites \s \S \d \D \w \W to the Unicode classes Oniguruma and Python's regex module give
// them (PCRE2's own \s adds U+180E, its \w lacks marks and connector punctuation).
std::string translate_pattern(std::string_view pattern);

// Escapes a literal string for use inside a pattern.
std::string escape_literal(std::string_view s);

}  // namespace mt::data
