#include "data/zstd_reader.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"
#ifdef MT_HAVE_ZSTD
#include <zstd.h>
#endif

namespace mt::data {

#ifdef MT_HAVE_ZSTD
struct ZstdReader::Stream {
  ZSTD_DStream* ds = ZSTD_createDStream();
  ~Stream() { ZSTD_freeDStream(ds); }
};

ZstdReader::ZstdReader(const std::string& path) : path_(path), zs_(std::make_unique<Stream>()), in_(ZSTD_DStreamInSize()) {
  if (!zs_->ds) fail("--input {}: cannot start the zstd decompressor (out of memory?)", path);
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) fail("cannot open --input {}: {}", path, std::strerror(errno));
}

ZstdReader::~ZstdReader() {
  if (file_) std::fclose(file_);
}

size_t ZstdReader::read(char* out, size_t n) {
  if (done_ || n == 0) return 0;
  ZSTD_outBuffer ob{out, n, 0};
  while (ob.pos == 0) {
    if (in_pos_ == in_end_) {
      in_end_ = std::fread(in_.data(), 1, in_.size(), file_);
      in_pos_ = 0;
      if (in_end_ == 0) {
        if (std::ferror(file_)) error_ = std::strerror(errno);
        else if (in_frame_) error_ = "the file ends inside a zstd frame (truncated)";
        done_ = true;
        return 0;
      }
    }
    ZSTD_inBuffer ib{in_.data(), in_end_, in_pos_};
    const size_t rc = ZSTD_decompressStream(zs_->ds, &ob, &ib);
    in_pos_ = ib.pos;
    if (ZSTD_isError(rc)) {
      error_ = ZSTD_getErrorName(rc);
      done_ = true;
      return ob.pos;  // what came before the damage
    }
    in_frame_ = rc != 0;  // 0: a frame ended exactly here (another may follow)
  }
  return ob.pos;
}
#else
struct ZstdReader::Stream {};

ZstdReader::ZstdReader(const std::string& path) : path_(path) {
  fail("--input {}: this build has no zstd support; install libzstd-dev (scripts/install_deps.sh) and rebuild, or "
       "decompress the file first (zstd -d)",
       path);
}

ZstdReader::~ZstdReader() = default;

size_t ZstdReader::read(char*, size_t) { return 0; }
#endif

}  // namespace mt::data
