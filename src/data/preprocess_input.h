#pragma once
// Input side of `megatron preprocess`: --input patterns expanded to files, and a line reader
// that reads plain or gzip-compressed JSONL in constant memory.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace mt::data {

class GzipReader;
class ZstdReader;

// Expands each --input entry (a path or a glob pattern) into sorted file names. Throws
// mt::Error naming the entry when a path does not exist or a pattern matches nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

class LineReader {
 public:
  explicit LineReader(const std::string& path);  // "*.gz" is decompressed with zlib
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its "\n" (or "\r\n"); false at the end of the file.
  bool next(std::string& line);
  int64_t line_number() const { return line_no_; }  // 1-based number of the last line returned
  const std::string& path() const { return path_; }

 private:
  bool refill();

  std::string path_;
  std::unique_ptr<GzipReader> gz_;
  std::unique_ptr<ZstdReader> zst_;  // .zst input
  std::FILE* file_ = nullptr;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;  // no more input (the end, or gzip damage: gz_->error() says)
  int64_t line_no_ = 0;
};

}  // namespace mt::data
