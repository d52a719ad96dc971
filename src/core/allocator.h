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

}  // namespace mt
