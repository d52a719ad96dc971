#pragma once
// A typed device allocation with host round trips, for tests, benchmarks and glue code that does
// not go through Tensor. bf16 buffers take and return fp32 host values (rounded to nearest even,
// the same bits as core/dtype.h's f32_to_bf16).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n) MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  template <typename H>
  explicit DeviceBuffer(const std::vector<H>& host) : DeviceBuffer(host.size()) {
    upload(host);
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  operator T*() const { return p_; }
  size_t size() const { return n_; }

  // Host values in; for bf16 buffers any float type is rounded to bf16.
  template <typename H>
  void upload(const std::vector<H>& host) {
    if constexpr (std::is_same_v<T, bf16>) {
      std::vector<uint16_t> bits(host.size());
      for (size_t i = 0; i < host.size(); ++i) bits[i] = f32_to_bf16(static_cast<float>(host[i]));
      MT_CUDA_CHECK(cudaMemcpy(p_, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    } else {
      static_assert(std::is_same_v<T, H>, "upload needs the buffer's own type (or any float type for bf16)");
      MT_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  // Device values out (bf16 widened to float). Synchronises the device.
  auto download() const {
    if constexpr (std::is_same_v<T, bf16>) {
      std::vector<uint16_t> bits(n_);
      MT_CUDA_CHECK(cudaMemcpy(bits.data(), p_, n_ * 2, cudaMemcpyDeviceToHost));
      std::vector<float> out(n_);
      for (size_t i = 0; i < n_; ++i) out[i] = bf16_to_f32(bits[i]);
      return out;
    } else {
      std::vector<T> out(n_);
      MT_CUDA_CHECK(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
      return out;
    }
  }
  // Raw bytes out, for bit-exact comparisons.
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(n_ * sizeof(T));
    MT_CUDA_CHECK(cudaMemcpy(out.data(), p_, out.size(), cudaMemcpyDeviceToHost));
    return out;
  }
  void fill_bytes(int value) { MT_CUDA_CHECK(cudaMemset(p_, value, n_ * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace mt::cuda
