#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mt {

bool is_regular_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

namespace {

[[noreturn]] void refuse(mode_t mode, const std::string& path, const std::string& what) {
  if (S_ISDIR(mode)) fail("{}: '{}' is a directory, expected a file", what, path);
  fail("{}: '{}' is not a regular file (a FIFO, socket or device); name a plain file", what, path);
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open '{}': {}", what, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(st.st_mode, path, what);
}

int open_regular_file(const std::string& path, const std::string& what, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open '{}': {}", what, path, std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("{}: cannot stat '{}': {}", what, path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(st.st_mode, path, what);
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

}  // namespace mt
