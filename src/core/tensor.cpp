#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mt {

Storage::Storage(size_t n, Allocator* a) : bytes(n), allocator(a) { data = a->allocate(n); }
Storage::~Storage() {
  if (data) allocator->deallocate(data, bytes);
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) MT_CHECK(d >= 0, "negative dimension in {}", shape_to_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  Allocator* a = device == Device::CPU ? cpu_allocator() : cuda_allocator();
  if (!a) fail("no CUDA device available (built without CUDA or no GPU found); use --device cpu");
  t.storage_ = std::make_shared<Storage>(std::max<size_t>(t.nbytes(), 1), a);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  MT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "size mismatch");
  Tensor t = empty(shape, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& shape) {
  MT_CHECK(static_cast<int64_t>(v.size()) == shape_numel(shape), "size mismatch");
  Tensor t = empty(shape, DType::I32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  MT_CHECK(i >= 0 && i < n, "dim {} out of range for shape {}", i, shape_str());
  return shape_[static_cast<size_t>(i)];
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data) + offset_;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_CHECK(infer < 0, "only one -1 allowed in view");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<size_t>(infer)] = known ? numel_ / known : 0;
  MT_CHECK(shape_numel(s) == numel_, "cannot view {} as {}", shape_str(), shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::slice(int64_t start, int64_t length) const {
  MT_CHECK(ndim() >= 1 && start >= 0 && start + length <= shape_[0], "slice [{}, +{}) out of {}", start,
           length, shape_str());
  Tensor t = *this;
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.offset_ += static_cast<size_t>(start * row) * dtype_size(dtype_);
  t.shape_[0] = length;
  t.numel_ = row * length;
  return t;
}

Tensor Tensor::flat_range(int64_t start, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  MT_CHECK(start >= 0 && start + n <= numel_, "flat range [{}, +{}) out of {}", start, n, numel_);
  Tensor t = *this;
  t.offset_ += static_cast<size_t>(start) * dtype_size(dtype_);
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to_device(Device d) const {
  Tensor t = empty(shape_, dtype_, d);
  device_copy(t.raw(), d, raw(), device(), nbytes());
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MT_CHECK(src.numel_ == numel_, "copy_from: {} vs {}", src.shape_str(), shape_str());
  if (src.dtype_ == dtype_ && (device() != Device::CPU || src.device() != Device::CPU)) {
    device_copy(raw(), device(), src.raw(), src.device(), nbytes());
    return;
  }
  MT_CHECK(device() == Device::CPU && src.device() == Device::CPU, "copy_from with a dtype change is CPU-only");
  if (src.dtype_ == dtype_) {
    if (nbytes()) std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  Tensor converted = src.to(dtype_);
  std::memcpy(raw(), converted.raw(), nbytes());
}

void Tensor::zero_() { device_zero(raw(), device(), nbytes()); }

void Tensor::fill_(float value) {
  MT_CHECK(dtype_ == DType::F32 && device() == Device::CPU, "fill_ needs a CPU f32 tensor");
  std::fill(data<float>(), data<float>() + numel_, value);
}

namespace {
float load_as_f32(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::I64: return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DType::U16: return static_cast<float>(static_cast<const uint16_t*>(p)[i]);
    case DType::U8: return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.f;
}
void store_from_f32(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
  }
}
bool is_int(DType t) { return t == DType::I32 || t == DType::I64 || t == DType::U16 || t == DType::U8; }
}  // namespace

Tensor Tensor::to(DType dtype) const {
  MT_CHECK(device() == Device::CPU, "to(dtype) is CPU-only here");
  if (dtype == dtype_) return clone();
  Tensor t = empty(shape_, dtype);
  const void* s = raw();
  void* d = t.raw();
  if (is_int(dtype_) && is_int(dtype)) {
    // Exact integer conversion (through int64).
    for (int64_t i = 0; i < numel_; ++i) {
      int64_t v = dtype_ == DType::I32   ? static_cast<const int32_t*>(s)[i]
                  : dtype_ == DType::I64 ? static_cast<const int64_t*>(s)[i]
                  : dtype_ == DType::U16 ? static_cast<const uint16_t*>(s)[i]
                                         : static_cast<const uint8_t*>(s)[i];
      switch (dtype) {
        case DType::I32: static_cast<int32_t*>(d)[i] = static_cast<int32_t>(v); break;
        case DType::I64: static_cast<int64_t*>(d)[i] = v; break;
        case DType::U16: static_cast<uint16_t*>(d)[i] = static_cast<uint16_t>(v); break;
        default: static_cast<uint8_t*>(d)[i] = static_cast<uint8_t>(v); break;
      }
    }
    return t;
  }
  for (int64_t i = 0; i < numel_; ++i) store_from_f32(d, dtype, i, load_as_f32(s, dtype_, i));
  return t;
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) out[static_cast<size_t>(i)] = load_as_f32(raw(), dtype_, i);
  return out;
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

}  // namespace mt
