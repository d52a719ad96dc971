#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/io_util.h"
#include "core/error.h"
#include "core/files.h"

namespace mt::checkpoint {
std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

uint32_t write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t off = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // align data to 8 bytes, as the HF writer does
  NewFile f(path);  // exclusively, never through a link
  uint64_t n = h.size();
  uLong crc = crc32(0L, Z_NULL, 0);
  auto put = [&](const void* p, size_t len) {
    f.write(p, len);
    for (size_t done = 0; done < len;) {  // zlib takes uInt lengths
      uInt chunk = static_cast<uInt>(std::min<size_t>(len - done, 1u << 30));
      crc = crc32(crc, static_cast<const Bytef*>(p) + done, chunk);
      done += chunk;
    }
  };
  put(&n, 8);
  put(h.data(), h.size());
  for (const auto& t : tensors) put(t.data, t.nbytes);
  f.sync_and_close();
  return static_cast<uint32_t>(crc);
}

uint32_t crc32_bytes(const void* data, uint64_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (uint64_t done = 0; done < n;) {  // zlib takes uInt lengths
    uInt chunk = static_cast<uInt>(std::min<uint64_t>(n - done, 1u << 30));
    crc = crc32(crc, static_cast<const Bytef*>(data) + done, chunk);
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

uint32_t crc32_file(const std::string& path) {
  require_regular_file(path, "checkpoint file");  // a FIFO or /dev/zero would never end
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read '{}'", path);
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    auto got = f.gcount();
    if (got > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(got));
  }
  return static_cast<uint32_t>(crc);
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (addr) ::munmap(addr, size);
  }
};

const uint8_t* SafetensorsFile::file_data() const { return static_cast<const uint8_t*>(map_->addr); }
uint64_t SafetensorsFile::file_size() const { return map_->size; }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(std::make_shared<Mapping>()) {
  // A FIFO or a device would block open() or read forever: regular files only.
  uint64_t size = 0;
  int fd = open_regular_file(path, "safetensors file", &size);
  if (size < 8) {
    ::close(fd);
    fail("'{}' is not a safetensors file (only {} bytes)", path, size);
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) fail("cannot map '{}' into memory", path);
  map_->addr = addr;
  map_->size = size;
  SafetensorsHeader h = parse_safetensors(static_cast<const uint8_t*>(addr), size, path);
  index_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
}

const TensorEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("tensor '{}' is missing from '{}'", name, path_);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

void SafetensorsFile::read_f32(const std::string& name, const Shape& expected, float* dst) const {
  const TensorEntry& e = entry(name);
  if (e.shape != expected)
    fail("tensor '{}' in '{}' has shape {} but the model expects {} (checkpoint of another model shape?)", name, path_,
         shape_to_string(e.shape), shape_to_string(expected));
  if (e.dtype != DType::F32 && e.dtype != DType::BF16 && e.dtype != DType::F16)
    fail("tensor '{}' in '{}' is stored as {}, but it is a float parameter (F32, BF16 or F16 expected)", name, path_,
         safetensors_dtype(e.dtype));
  int64_t n = shape_numel(e.shape);
  if (e.dtype == DType::F32) {
    std::memcpy(dst, e.data, e.nbytes);
    return;
  }
  Tensor t = Tensor::empty(e.shape, e.dtype);
  std::memcpy(t.raw(), e.data, e.nbytes);
  auto v = t.to_vector();
  std::copy_n(v.data(), n, dst);
}

}  // namespace mt::checkpoint
