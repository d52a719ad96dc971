#include "data/tokenizers/file_util.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/files.h"

namespace mt::data {

std::string read_tokenizer_file(const std::string& path, std::string_view flag) {
  require_regular_file(path, std::string(flag));  // a FIFO would block the read forever
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{} {}: cannot open the file; check the path", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{} {}: read error", flag, path);
  return std::move(ss).str();
}

nlohmann::json read_tokenizer_json(const std::string& path, std::string_view flag) {
  const std::string text = read_tokenizer_file(path, flag);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("{} {}: not valid JSON ({}); use the original file", flag, path, e.what());
  }
}

}  // namespace mt::data
