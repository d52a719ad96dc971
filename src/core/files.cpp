#include "core/files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mt {

bool is_regular_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) fail("{}: cannot open '{}': {}", what, path, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: '{}' is a directory, expected a file", what, path);
  if (!S_ISREG(st.st_mode))
    fail("{}: '{}' is not a regular file (a FIFO, socket or device); name a plain file", what, path);
}

}  // namespace mt
