#pragma once
// Safetensors files (HF's format: u64 header length, JSON header, raw little-endian data): plain
// data, never code. The reader maps the file (only the tensors read are paged in, so a rank
// that needs a slice of a large shard does not read all of it) and validates the header before
// trusting any size in it.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mt::checkpoint {

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;  // for writing
  size_t nbytes = 0;
};

// Writes atomically enough for our use: the caller writes into a temporary directory.
// Returns the CRC32 of the whole file.
uint32_t write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

// A validated header: the tensors (data pointing into the bytes given) and the string metadata.
struct SafetensorsHeader {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};
// Parses the header of the safetensors file `bytes` (all `size` bytes of it): every size and
// offset is checked, and the tensors must tile the data section exactly. Throws mt::Error naming
// `path` and the tensor.
SafetensorsHeader parse_safetensors(const uint8_t* bytes, uint64_t size, const std::string& path);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // reads and validates; throws mt::Error naming the file
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorEntry& entry(const std::string& name) const;  // throws naming tensor and file
  std::vector<std::string> names() const;
  // Copies tensor `name` into dst (converted to f32) after checking its shape; refuses integer
  // dtypes (a float parameter stored as I32 is a corrupt or foreign file, not a number to convert).
  void read_f32(const std::string& name, const Shape& expected, float* dst) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }
  // The whole file as mapped (for checksums).
  const uint8_t* file_data() const;
  uint64_t file_size() const;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> map_;
  std::map<std::string, TensorEntry> index_;
  std::map<std::string, std::string> metadata_;
};

std::string safetensors_dtype(DType t);
uint32_t crc32_file(const std::string& path);
uint32_t crc32_bytes(const void* data, uint64_t n);

}  // namespace mt::checkpoint
