#pragma once
// UTF-8 helpers shared by the tokenizers: decoding one code point at a time without allocating,
// and repairing invalid input before it reaches PCRE2 (which requires valid UTF-8).
#include <cstdint>
#include <string>
#include <string_view>

namespace mt::data::utf8 {

// Length in bytes of the code point starting at s[i], trusting that s is valid UTF-8.
inline size_t char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// Decodes the code point at s[i] (s must be valid UTF-8) and advances i past it.
inline char32_t next(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t n = char_len(b0);
  char32_t cp = b0 & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append(std::string& out, char32_t cp);

// Length of the longest prefix of s that is valid UTF-8 (s.size() when all of it is).
size_t valid_prefix(std::string_view s);

// Returns s with every invalid sequence replaced by U+FFFD (one per maximal invalid subpart,
// as the WHATWG decoder and Python's errors="replace" do).
std::string sanitize(std::string_view s);

// s itself when it is valid UTF-8, else its sanitized copy kept in `storage` (what the
// tokenizers encode: Python's str never holds invalid UTF-8).
inline std::string_view valid_text(std::string_view s, std::string& storage) {
  if (valid_prefix(s) == s.size()) return s;
  storage = sanitize(s);
  return storage;
}

}  // namespace mt::data::utf8
