#pragma once
// Decompresses a .zst file (one or more zstd frames, as `cat a.zst b.zst` makes) in constant
// memory, with GzipReader's contract: every byte decompressed before damage is handed out first,
// then read() returns 0 and error() says what is wrong, so a caller can name the line. Builds
// without libzstd (MT_HAVE_ZSTD unset) refuse .zst files by name.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace mt::data {

class ZstdReader {
 public:
  explicit ZstdReader(const std::string& path);  // throws mt::Error naming the file
  ~ZstdReader();
  ZstdReader(const ZstdReader&) = delete;
  ZstdReader& operator=(const ZstdReader&) = delete;

  size_t read(char* out, size_t n);
  const std::string& error() const { return error_; }

 private:
  struct Stream;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Stream> zs_;
  std::vector<char> in_;
  size_t in_pos_ = 0, in_end_ = 0;
  bool in_frame_ = false, done_ = false;
  std::string error_;
};

}  // namespace mt::data
