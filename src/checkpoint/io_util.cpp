#include "checkpoint/io_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>

#include "core/error.h"

namespace mt::checkpoint {

void fsync_path(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void write_text_durable(const std::filesystem::path& p, const std::string& text) {
  const std::filesystem::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc | std::ios::binary);
    if (!f) fail("cannot write '{}' (check the directory exists and is writable)", tmp.string());
    f << text;
    f.flush();
    if (!f) fail("writing '{}' failed (disk full?)", tmp.string());
  }
  fsync_path(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, p, ec);
  if (ec) fail("cannot rename '{}' to '{}': {}", tmp.string(), p.string(), ec.message());
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read '{}' (missing file: incomplete or foreign checkpoint?)", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

nlohmann::json parse_json_file(const std::filesystem::path& p) {
  try {
    return nlohmann::json::parse(read_text(p));
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is corrupt: {}", p.string(), e.what());
  }
}

}  // namespace mt::checkpoint
