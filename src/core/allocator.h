#pragma once
// Where tensor storage comes from. The CPU allocator hands out 64-byte aligned host memory;
// the CUDA backend implements the same interface over stream-ordered memory pools.
#include <cstddef>
#include <cstdint>

namespace mt {

enum class Device : uint8_t { CPU, CUDA };

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
};

Allocator* cpu_allocator();

// Allocator used for Device::CUDA tensors; nullptr until the CUDA backend registers one.
Allocator* cuda_allocator();
void register_cuda_allocator(Allocator* a);

// Copies bytes between devices (host<->device, device<->device); registered by the CUDA backend
// so that core stays free of CUDA headers. Synchronous with respect to the host.
using DeviceCopyFn = void (*)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
void register_device_copy(DeviceCopyFn fn);
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
using DeviceZeroFn = void (*)(void* dst, size_t bytes);  // memset 0 on the CUDA device
void register_device_zero(DeviceZeroFn fn);
void device_zero(void* dst, Device dev, size_t bytes);

}  // namespace mt
