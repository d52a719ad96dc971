#pragma once
// GPT-2's reversible map between bytes and printable Unicode characters: byte-level BPE
// vocabularies spell every token with these characters, so that no token contains a space or
// a control character.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mt::data::byte_level {

// The character (as UTF-8) standing for byte b.
const std::string& char_for_byte(uint8_t b);

// The byte that code point cp stands for, if it is one of the 256 mapped characters.
std::optional<uint8_t> byte_for_char(char32_t cp);

// Maps a token spelled in byte-level characters back to raw bytes. Returns false (and leaves
// `out` unspecified) when the token holds a character outside the map.
bool decode_token(std::string_view token, std::string& out);

// Spells raw bytes in byte-level characters.
std::string encode_bytes(std::string_view raw);

}  // namespace mt::data::byte_level
