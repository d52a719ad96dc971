#pragma once
// Tensor: a shape, a dtype and a byte offset into shared storage. Always contiguous (row-major);
// views (reshape, slices along the first dimension, flat ranges) share storage and are cheap.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"

namespace mt {

using Shape = std::vector<int64_t>;

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Allocator* allocator = nullptr;
  Storage(size_t n, Allocator* a);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  static Tensor from_vector(const std::vector<int32_t>& v, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->allocator->device() : Device::CPU; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  void* raw() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Views sharing storage.
  Tensor view(const Shape& shape) const;                       // same numel; one dim may be -1
  Tensor slice(int64_t start, int64_t length) const;           // along dim 0
  Tensor flat_range(int64_t start, const Shape& shape) const;  // elements [start, start+numel(shape))

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;  // CPU dtype conversion (float types via f32)
  Tensor to_device(Device d) const;  // same dtype, copied to device d (a no-op copy when equal)
  void copy_from(const Tensor& src);
  void zero_();
  void fill_(float value);
  std::vector<float> to_vector() const;  // any float dtype -> f32 values

  std::string shape_str() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
};

int64_t shape_numel(const Shape& s);
std::string shape_to_string(const Shape& s);

}  // namespace mt
