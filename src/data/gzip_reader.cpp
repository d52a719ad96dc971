#include "data/gzip_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace mt::data {

namespace {
constexpr size_t kInputBuffer = 256 * 1024;
constexpr int kGzipWindowBits = 15 + 16;  // the largest window, gzip wrapper only
}  // namespace

GzipReader::GzipReader(const std::string& path) : path_(path), in_(kInputBuffer) {
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) fail("cannot open --input {}: {}", path, std::strerror(errno));
  if (::inflateInit2(&zs_, kGzipWindowBits) != Z_OK) {
    std::fclose(file_);
    fail("{}: cannot start zlib's decompressor (out of memory?)", path);
  }
}

GzipReader::~GzipReader() {
  ::inflateEnd(&zs_);
  std::fclose(file_);
}

bool GzipReader::fill_input() {
  const size_t got = std::fread(in_.data(), 1, in_.size(), file_);
  if (got == 0 && std::ferror(file_)) error_ = std::string("read error: ") + std::strerror(errno);
  zs_.next_in = in_.data();
  zs_.avail_in = static_cast<uInt>(got);
  return got > 0;
}

size_t GzipReader::read(char* out, size_t n) {
  n = std::min<size_t>(n, std::numeric_limits<uInt>::max());
  zs_.next_out = reinterpret_cast<unsigned char*>(out);
  zs_.avail_out = static_cast<uInt>(n);
  while (zs_.avail_out > 0 && !done_ && error_.empty()) {
    if (zs_.avail_in == 0 && !fill_input()) {
      if (error_.empty() && in_member_) error_ = "unexpected end of file: the file is truncated";
      done_ = true;
      break;
    }
    if (!in_member_) {
      // After a member: zero bytes (padding some tools add) are skipped; anything else must be
      // the next member's header, which inflate checks.
      while (members_ > 0 && zs_.avail_in > 0 && *zs_.next_in == 0) {
        ++zs_.next_in;
        --zs_.avail_in;
      }
      if (zs_.avail_in == 0) continue;
      ::inflateReset(&zs_);
      in_member_ = true;
    }
    const int rc = ::inflate(&zs_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      in_member_ = false;
      ++members_;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {  // Z_BUF_ERROR: needs more input or output
      error_ = zs_.msg ? zs_.msg : "zlib error " + std::to_string(rc);
      if (members_ == 0 && zs_.total_out == 0) error_ = "not gzip data: " + error_;
    }
  }
  return n - zs_.avail_out;
}

}  // namespace mt::data
