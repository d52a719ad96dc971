#include "data/numpy_npy.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "core/checked.h"
#include "core/error.h"

namespace mt::data {

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

size_t itemsize_of(const std::string& descr) {
  if (descr == "<i2") return 2;
  if (descr == "<i4" || descr == "<u4") return 4;
  if (descr == "<i8") return 8;
  return 0;
}

// The value text after `'key':` in the header dict, trimmed; "" when absent.
std::string field(const std::string& h, const std::string& key) {
  const auto k = h.find("'" + key + "'");
  if (k == std::string::npos) return "";
  auto p = h.find(':', k);
  if (p == std::string::npos) return "";
  ++p;
  while (p < h.size() && h[p] == ' ') ++p;
  size_t e = p;
  if (p < h.size() && h[p] == '(') {
    e = h.find(')', p);
    return e == std::string::npos ? "" : h.substr(p, e - p + 1);
  }
  if (p < h.size() && h[p] == '\'') {
    e = h.find('\'', p + 1);
    return e == std::string::npos ? "" : h.substr(p + 1, e - p - 1);
  }
  while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
  return h.substr(p, e - p);
}

// Index arrays run to tens of MB (a mock dataset's sample index at a short sequence is 34 MB);
// faulting them in 4 KiB at a time was most of a small run's start-up on a VM. Transparent huge
// pages, where the kernel offers them on request, cut the faults 512-fold. Advice only: any
// failure leaves ordinary pages.
void advise_huge_pages(void* p, size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace

NpyArray::NpyArray(std::string descr, std::vector<int64_t> shape)
    : descr_(std::move(descr)), shape_(std::move(shape)), itemsize_(itemsize_of(descr_)),
      unsigned_(descr_ == "<u4") {
  MT_CHECK(itemsize_ > 0, "unsupported npy dtype {}", descr_);
  const size_t bytes = static_cast<size_t>(numel()) * itemsize_;
  owned_.reserve(bytes);  // allocated, not yet touched
  advise_huge_pages(owned_.data(), bytes);
  owned_.assign(bytes, 0);
}

int64_t NpyArray::numel() const { return checked_product(shape_, "npy array shape"); }

int64_t NpyArray::at(int64_t i) const {
  const uint8_t* p = bytes() + static_cast<size_t>(i) * itemsize_;
  switch (itemsize_) {
    case 2: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case 4:
      if (unsigned_) { uint32_t v; std::memcpy(&v, p, 4); return v; }
      else { int32_t v; std::memcpy(&v, p, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

void NpyArray::set(int64_t i, int64_t v) {
  uint8_t* p = owned_.data() + static_cast<size_t>(i) * itemsize_;
  if (itemsize_ == 2) { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); }
  else if (itemsize_ == 4) { uint32_t x = static_cast<uint32_t>(v); std::memcpy(p, &x, 4); }
  else std::memcpy(p, &v, 8);
}

void NpyArray::save(const std::string& path) const {
  // numpy's tuple repr: "(7,)" for one dimension, "(7, 2)" for two.
  std::string shape = "(";
  for (size_t i = 0; i < shape_.size(); ++i) shape += (i ? ", " : "") + std::to_string(shape_[i]);
  shape += shape_.size() == 1 ? ",)" : ")";
  std::string header = "{'descr': '" + descr_ + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // numpy pads the header with spaces and a newline so the data starts 64-byte aligned.
  const size_t total = sizeof(kMagic) + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  const std::string tmp = path + temp_suffix();
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("cannot create {}: {} (check --data-cache-path)", tmp, std::strerror(errno));
  const uint8_t ver[2] = {1, 0};
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  const uint8_t* data = bytes();
  const size_t nbytes = static_cast<size_t>(numel()) * itemsize_;
  bool ok = std::fwrite(kMagic, 1, 6, f) == 6 && std::fwrite(ver, 1, 2, f) == 2 &&
            std::fwrite(&hlen, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (nbytes == 0 || std::fwrite(data, 1, nbytes, f) == nbytes);
  ok = (std::fflush(f) == 0) && ok;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail("writing {} failed: {} (disk full?)", path, why);
  }
}

NpyArray NpyArray::load(const std::string& path) {
  NpyArray a;
  a.map_ = MappedFile(path);
  const uint8_t* p = a.map_.data();
  const size_t size = a.map_.size();
  if (size < 10 || std::memcmp(p, kMagic, 6) != 0) fail("{} is not a .npy file (bad magic)", path);
  size_t hlen, start;
  if (p[6] == 1) {
    hlen = static_cast<size_t>(p[8]) | static_cast<size_t>(p[9]) << 8;
    start = 10;
  } else if ((p[6] == 2 || p[6] == 3) && size >= 12) {
    hlen = static_cast<size_t>(p[8]) | static_cast<size_t>(p[9]) << 8 |
           static_cast<size_t>(p[10]) << 16 | static_cast<size_t>(p[11]) << 24;
    start = 12;
  } else {
    fail("{} has unsupported .npy version {}", path, p[6]);
  }
  if (start + hlen > size) fail("{} is truncated inside its .npy header", path);
  const std::string h(reinterpret_cast<const char*>(p + start), hlen);
  a.descr_ = field(h, "descr");
  a.itemsize_ = itemsize_of(a.descr_);
  a.unsigned_ = a.descr_ == "<u4";
  if (a.itemsize_ == 0) fail("{} holds dtype '{}', not one of <i2 <i4 <u4 <i8", path, a.descr_);
  if (field(h, "fortran_order") != "False") fail("{} is Fortran-ordered; expected C order", path);
  const std::string shape = field(h, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') {
    fail("{} has no shape tuple in its .npy header", path);
  }
  size_t i = 1;
  while (i < shape.size() - 1) {
    while (i < shape.size() - 1 && (shape[i] == ' ' || shape[i] == ',')) ++i;
    if (i >= shape.size() - 1) break;
    size_t used = 0;
    int64_t d = -1;
    try {
      d = std::stoll(shape.substr(i), &used);
    } catch (...) {
    }
    if (d < 0 || used == 0) fail("{} has a malformed shape {} in its .npy header", path, shape);
    a.shape_.push_back(d);
    i += used;
  }
  a.offset_ = start + hlen;
  // The shape comes from the file: its product and byte size are checked for overflow before
  // they are compared with the file size (a wrapped product would pass as a small array).
  const std::string what = fmt::format("{}: .npy shape {}", path, shape);
  const int64_t n = checked_product(a.shape_, what);
  const int64_t nbytes = checked_mul(n, static_cast<int64_t>(a.itemsize_), what);
  const uint64_t have = size - a.offset_;
  if (static_cast<uint64_t>(nbytes) != have) {
    fail("{} is truncated or corrupt: shape {} of {} needs {} data bytes, the file has {}", path,
         shape, a.descr_, nbytes, have);
  }
  return a;
}

}  // namespace mt::data
