#pragma once
// numpy's .npy format (version 1.0), for Megatron's index caches: GPTDataset and BlendedDataset
// save their indices as .npy files, so caches written here can be inspected (and checked) with
// numpy, and loading one validates the header and the size before any element is read.
#include <cstdint>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace mt::data {

// A loaded (memory-mapped) or freshly built 1-D or 2-D integer array.
class NpyArray {
 public:
  NpyArray() = default;
  // descr is numpy's little-endian type string: "<i2", "<i4", "<u4", "<i8".
  NpyArray(std::string descr, std::vector<int64_t> shape);  // zero-filled, owned
  // Maps `path`; throws mt::Error naming the file when it is not a valid .npy of an integer type.
  static NpyArray load(const std::string& path);

  const std::string& descr() const { return descr_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  size_t itemsize() const { return itemsize_; }
  int64_t at(int64_t i) const;  // element i of the flattened array, widened to int64
  void set(int64_t i, int64_t v);
  const uint8_t* bytes() const { return owned_.empty() ? map_.data() + offset_ : owned_.data(); }
  uint8_t* mutable_bytes() { return owned_.data(); }

  // Writes to a temporary name and renames, so a reader never sees a partial cache file.
  void save(const std::string& path) const;

 private:
  std::string descr_;
  std::vector<int64_t> shape_;
  size_t itemsize_ = 0;
  bool unsigned_ = false;
  std::vector<uint8_t> owned_;
  MappedFile map_;
  size_t offset_ = 0;
};

}  // namespace mt::data
