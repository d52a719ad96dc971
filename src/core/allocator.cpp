#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace mt {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) fail("out of host memory allocating {:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
    return p;
  }
  void deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return Device::CPU; }
};

Allocator* g_cuda = nullptr;

}  // namespace

Allocator* cpu_allocator() {
  static CpuAllocator a;
  return &a;
}
Allocator* cuda_allocator() { return g_cuda; }
void register_cuda_allocator(Allocator* a) { g_cuda = a; }

}  // namespace mt
