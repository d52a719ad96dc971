#pragma once
// Small file helpers shared by the checkpoint writers and readers: every write names its file
// in the error, and durability comes from fsyncing files and then their directory.
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace mt::checkpoint {

void fsync_path(const std::filesystem::path& p);
// Writes `text` to p.tmp, fsyncs it and renames it to p: a reader sees the old file or the new one.
void write_text_durable(const std::filesystem::path& p, const std::string& text);
std::string read_text(const std::filesystem::path& p);
nlohmann::json parse_json_file(const std::filesystem::path& p);

}  // namespace mt::checkpoint
