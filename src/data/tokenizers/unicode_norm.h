#pragma once
// Unicode normalization forms (NFC, NFD, NFKC, NFKD) and lowercasing for the HF normalizers,
// from generated tables (unicode_norm_data.cpp) so no ICU is needed. Input must be valid UTF-8.
#include <string>
#include <string_view>

namespace mt::data {

enum class NormForm { NFC, NFD, NFKC, NFKD };

std::string unicode_normalize(std::string_view text, NormForm form);

// Full Unicode lowercase of each character (no context rules, like Rust's char::to_lowercase).
std::string unicode_lowercase(std::string_view text);

// Canonical combining class of cp (0 for starters).
int combining_class(char32_t cp);

// The Unicode version of the tables.
const char* unicode_norm_version();

}  // namespace mt::data
