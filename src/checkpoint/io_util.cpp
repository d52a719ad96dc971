#include "checkpoint/io_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/files.h"

namespace mt::checkpoint {

void fsync_path(const std::filesystem::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

NewFile::NewFile(const std::filesystem::path& p) : path_(p) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(p.c_str());
  fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail("cannot create '{}': {} (check the directory exists and is writable; nothing else may create this name "
         "meanwhile)",
         p.string(), std::strerror(errno));
}

NewFile::~NewFile() {
  if (fd_ >= 0) ::close(fd_);
}

void NewFile::write(const void* data, size_t n) {
  const char* c = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, c, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("writing '{}' failed: {} (disk full?)", path_.string(), std::strerror(errno));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

void NewFile::sync_and_close() {
  const bool synced = ::fsync(fd_) == 0;
  const int err = errno;
  const bool closed = ::close(fd_) == 0;
  fd_ = -1;
  if (!synced || !closed) fail("writing '{}' failed: {} (disk full?)", path_.string(), std::strerror(synced ? errno : err));
}

void write_text_durable(const std::filesystem::path& p, const std::string& text) {
  const std::filesystem::path tmp = p.string() + ".tmp";
  {
    NewFile f(tmp);
    f.write(text.data(), text.size());
    f.sync_and_close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, p, ec);  // replaces p itself, even when p is a link
  if (ec) fail("cannot rename '{}' to '{}': {}", tmp.string(), p.string(), ec.message());
}

std::string read_text(const std::filesystem::path& p, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) fail("cannot read '{}' (missing file: incomplete or foreign checkpoint?)", p.string());
  require_regular_file(p.string(), what);
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot read '{}' (missing file: incomplete or foreign checkpoint?)", p.string());
  std::string s(std::istreambuf_iterator<char>(f), {});
  if (f.bad()) fail("reading '{}' failed", p.string());
  return s;
}

nlohmann::json parse_json_text(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' is corrupt: {}", where, e.what());
  }
}

nlohmann::json parse_json_file(const std::filesystem::path& p, const std::string& what) {
  return parse_json_text(read_text(p, what), p.string());
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace mt::checkpoint
