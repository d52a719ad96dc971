#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt::checkpoint {
namespace {

DType parse_dtype(const std::string& s, const std::string& path) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U16") return DType::U16;
  if (s == "U8") return DType::U8;
  fail("{}: unsupported safetensors dtype '{}'", path, s);
}

}  // namespace

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
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot write '{}' (check the directory exists and is writable)", path);
  uint64_t n = h.size();
  uLong crc = crc32(0L, Z_NULL, 0);
  auto put = [&](const void* p, size_t len) {
    f.write(static_cast<const char*>(p), static_cast<std::streamsize>(len));
    for (size_t done = 0; done < len;) {  // zlib takes uInt lengths
      uInt chunk = static_cast<uInt>(std::min<size_t>(len - done, 1u << 30));
      crc = crc32(crc, static_cast<const Bytef*>(p) + done, chunk);
      done += chunk;
    }
  };
  put(&n, 8);
  put(h.data(), h.size());
  for (const auto& t : tensors) put(t.data, t.nbytes);
  f.flush();
  if (!f) fail("writing '{}' failed (disk full?)", path);
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
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail("cannot open '{}' (missing file?)", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat '{}'", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    fail("'{}' is not a safetensors file (only {} bytes)", path, size);
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) fail("cannot map '{}' into memory", path);
  map_->addr = addr;
  map_->size = size;
  const char* bytes = static_cast<const char*>(addr);
  uint64_t n;
  std::memcpy(&n, bytes, 8);
  if (n > size - 8 || n > (100u << 20)) fail("'{}' has a corrupt safetensors header (length {} of a {}-byte file)", path, n, size);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail("'{}' has a corrupt safetensors header: {}", path, e.what());
  }
  if (!header.is_object()) fail("'{}' has a corrupt safetensors header (not a JSON object)", path);
  const uint64_t data_size = size - 8 - n;
  const char* base = bytes + 8 + n;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it.value().begin(); m != it.value().end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    try {
      TensorEntry e;
      e.name = it.key();
      e.dtype = parse_dtype(it.value().at("dtype").get<std::string>(), path);
      e.shape = it.value().at("shape").get<Shape>();
      auto offs = it.value().at("data_offsets").get<std::vector<uint64_t>>();
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        fail("'{}': tensor '{}' has data offsets outside the file (truncated?)", path, e.name);
      for (auto d : e.shape)
        if (d < 0) fail("'{}': tensor '{}' has a negative dimension", path, e.name);
      if (static_cast<uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype) != offs[1] - offs[0])
        fail("'{}': tensor '{}' size does not match its shape {}", path, e.name, shape_to_string(e.shape));
      e.data = base + offs[0];
      e.nbytes = offs[1] - offs[0];
      index_[e.name] = e;
    } catch (const nlohmann::json::exception& ex) {
      fail("'{}': malformed entry for tensor '{}': {}", path, it.key(), ex.what());
    }
  }
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
