#include "data/preprocess_input.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "data/gzip_reader.h"
#include "data/zstd_reader.h"

namespace mt::data {

namespace {
constexpr size_t kReadBuffer = 1 << 20;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (const auto& p : patterns) {
    if (p.find_first_of("*?[") == std::string::npos) {
      // A FIFO or device would block or never end; stdin ('-') is not an input either, as in
      // Megatron's tools/preprocess_data.py, which opens --input as a file.
      require_regular_file(p, "--input");
      files.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    std::vector<std::string> matched;
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (std::filesystem::is_regular_file(g.gl_pathv[i])) matched.emplace_back(g.gl_pathv[i]);
      }
    }
    ::globfree(&g);
    if (matched.empty()) fail("--input {}: the pattern matches no files", p);
    // Sorted, so the document order never depends on the directory listing.
    std::sort(matched.begin(), matched.end());
    files.insert(files.end(), matched.begin(), matched.end());
  }
  return files;
}

LineReader::LineReader(const std::string& path) : path_(path), buf_(kReadBuffer) {
  auto ends_with = [&](const char* ext) {
    const size_t n = std::strlen(ext);
    return path.size() > n && path.compare(path.size() - n, n, ext) == 0;
  };
  if (ends_with(".gz")) {
    gz_ = std::make_unique<GzipReader>(path);
  } else if (ends_with(".zst")) {
    zst_ = std::make_unique<ZstdReader>(path);
  } else {
    file_ = std::fopen(path.c_str(), "rb");
    if (!file_) fail("cannot open --input {}: {}", path, std::strerror(errno));
  }
}

LineReader::~LineReader() {
  if (file_) std::fclose(file_);
}

bool LineReader::refill() {
  if (eof_) return false;
  // Keep the unread tail at the front; grow when one line is longer than the buffer.
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);
  const size_t want = buf_.size() - end_;
  size_t got;
  if (gz_) {
    got = gz_->read(buf_.data() + end_, want);  // after damage: what came before it, then 0
  } else if (zst_) {
    got = zst_->read(buf_.data() + end_, want);
  } else {
    got = std::fread(buf_.data() + end_, 1, want, file_);
    if (got < want && std::ferror(file_)) fail("reading {} failed: {}", path_, std::strerror(errno));
  }
  if (got == 0) eof_ = true;
  end_ += got;
  return got > 0;
}

bool LineReader::next(std::string& line) {
  for (;;) {
    const char* start = buf_.data() + pos_;
    const void* nl = std::memchr(start, '\n', end_ - pos_);
    if (nl) {
      size_t len = static_cast<const char*>(nl) - start;
      line.assign(start, len > 0 && start[len - 1] == '\r' ? len - 1 : len);
      pos_ += len + 1;
      ++line_no_;
      return true;
    }
    if (!refill()) {
      if (gz_ && !gz_->error().empty()) {
        // The damage lies in the line after the last complete one; that line is not returned.
        fail("{}: corrupt or truncated gzip data at line {} ({}); re-create the file (gzip -t checks it)",
             path_, line_no_ + 1, gz_->error());
      }
      if (zst_ && !zst_->error().empty()) {
        fail("{}: corrupt or truncated zstd data at line {} ({}); re-create the file (zstd -t checks it)", path_,
             line_no_ + 1, zst_->error());
      }
      if (pos_ == end_) return false;
      // The last line has no newline.
      size_t len = end_ - pos_;
      line.assign(buf_.data() + pos_, len > 0 && buf_[pos_ + len - 1] == '\r' ? len - 1 : len);
      pos_ = end_;
      ++line_no_;
      return true;
    }
  }
}

}  // namespace mt::data
