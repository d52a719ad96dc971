#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/memory_timeline.h"

namespace mt {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) fail("out of host memory allocating {:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
    memory_timeline::on_alloc(Device::CPU, p, bytes);
    return p;
  }
  void deallocate(void* ptr, size_t) override {
    memory_timeline::on_free(Device::CPU, ptr);
    std::free(ptr);
  }
  Device device() const override { return Device::CPU; }
};

Allocator* g_cuda = nullptr;
DeviceCopyFn g_copy = nullptr;
DeviceZeroFn g_zero = nullptr;

}  // namespace

Allocator* cpu_allocator() {
  static CpuAllocator a;
  return &a;
}
Allocator* cuda_allocator() { return g_cuda; }
void register_cuda_allocator(Allocator* a) { g_cuda = a; }
void register_device_copy(DeviceCopyFn fn) { g_copy = fn; }
void register_device_zero(DeviceZeroFn fn) { g_zero = fn; }

void device_zero(void* dst, Device dev, size_t bytes) {
  if (bytes == 0) return;
  if (dev == Device::CPU) {
    std::memset(dst, 0, bytes);
    return;
  }
  if (!g_zero) fail("no CUDA backend is registered; use --device cpu");
  g_zero(dst, bytes);
}

void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::CPU && src_dev == Device::CPU) {
    std::memmove(dst, src, bytes);
    return;
  }
  if (!g_copy) fail("no CUDA backend is registered for a device copy; use --device cpu");
  g_copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace mt
