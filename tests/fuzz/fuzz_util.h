#pragma once
// Helpers for the libFuzzer targets: most parsers take a path, so the bytes go through a
// per-process temporary file; mt::Error is the parser refusing the input cleanly.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace mt::fuzz {

// Writes the bytes to <TMPDIR>/mt_fuzz_<pid>/<name> (created once) and returns the path.
inline std::string write_temp(const std::string& name, const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    std::string d = std::string(t && *t ? t : "/tmp") + "/mt_fuzz_" + std::to_string(::getpid());
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

inline std::string temp_dir() {
  write_temp(".probe", nullptr, 0);
  const char* t = std::getenv("TMPDIR");
  return std::string(t && *t ? t : "/tmp") + "/mt_fuzz_" + std::to_string(::getpid());
}

}  // namespace mt::fuzz
