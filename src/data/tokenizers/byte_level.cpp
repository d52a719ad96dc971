#include "data/tokenizers/byte_level.h"

#include "data/tokenizers/utf8.h"

namespace mt::data::byte_level {

namespace {

struct Tables {
  std::array<char32_t, 256> cp_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  Tables() {
    // Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F-0xA0,
    // 0xAD) are moved, in byte order, to U+0100 and up.
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      cp_of_byte[b] = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8::append(utf8_of_byte[b], cp_of_byte[b]);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& char_for_byte(uint8_t b) { return tables().utf8_of_byte[b]; }

std::optional<uint8_t> byte_for_char(char32_t cp) {
  // The image of the map is exactly U+0021..U+0143 minus nothing else: printable Latin-1 maps to
  // itself and the 68 others to U+0100..U+0143.
  if (cp >= 0x100 && cp < 0x100 + 68) {
    static const auto inverse = [] {
      std::array<uint8_t, 68> inv{};
      const auto& t = tables();
      for (int b = 0; b < 256; ++b) {
        if (t.cp_of_byte[b] >= 0x100) inv[t.cp_of_byte[b] - 0x100] = static_cast<uint8_t>(b);
      }
      return inv;
    }();
    return inverse[cp - 0x100];
  }
  if (cp < 0x100 && tables().cp_of_byte[cp] == cp) return static_cast<uint8_t>(cp);
  return std::nullopt;
}

bool decode_token(std::string_view token, std::string& out) {
  out.clear();
  size_t i = 0;
  while (i < token.size()) {
    const auto b = byte_for_char(utf8::next(token, i));
    if (!b) return false;
    out.push_back(static_cast<char>(*b));
  }
  return true;
}

std::string encode_bytes(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char c : raw) out += char_for_byte(c);
  return out;
}

}  // namespace mt::data::byte_level
