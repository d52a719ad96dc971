#pragma once
// Reading tokenizer files with errors that name the flag and the file.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace mt::data {

// Whole file as bytes; fails naming `flag` when it cannot be read.
std::string read_tokenizer_file(const std::string& path, std::string_view flag);

// Parses a JSON file; fails naming `flag` and the file when it is missing or malformed.
nlohmann::json read_tokenizer_json(const std::string& path, std::string_view flag);

}  // namespace mt::data
