#pragma once
// Decompresses a .gz file (one or more gzip members, as `cat a.gz b.gz` makes) in constant
// memory. Unlike zlib's gzread, which drops what it decompressed in a call that then fails, it
// hands out every byte decompressed before damage, so a caller can say at which line of the
// text a corrupt or truncated file breaks.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mt::data {

class GzipReader {
 public:
  explicit GzipReader(const std::string& path);  // throws mt::Error naming the file
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Up to n decompressed bytes; 0 at the end of the data or after damage (then error() says
  // what is wrong). Bytes decompressed before the damage are returned first.
  size_t read(char* out, size_t n);
  const std::string& error() const { return error_; }

 private:
  bool fill_input();  // false at the end of the file (or a read error, recorded in error_)

  std::string path_;
  std::FILE* file_ = nullptr;
  z_stream zs_{};
  std::vector<unsigned char> in_;
  bool in_member_ = false, done_ = false;
  int64_t members_ = 0;  // complete members read
  std::string error_;
};

}  // namespace mt::data
