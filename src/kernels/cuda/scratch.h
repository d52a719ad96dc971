#pragma once
// Stream-ordered scratch memory for the CUDA kernels and their host-side
// drivers (plain C++, so host .cpp files such as the cuDNN graph code can use
// it too).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {

// Kernel scratch in the allocator's books: counted into the "with kernel workspaces" peak that
// pretrain reports beside the tensor peak (a cuDNN attention workspace can be gigabytes), and an
// allocation that does not fit fails with the allocator's out-of-memory message, not a bare
// CUDA error. Defined in allocator.cpp.
void note_scratch_bytes(const void *p, int64_t delta);
[[noreturn]] void scratch_out_of_memory(cudaError_t e, size_t bytes);

// Scratch from the device's default pool (the one CudaAllocator draws from),
// allocated and freed in stream order on `s`: no host synchronisation, reused
// by the pool in the steady state.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t s) : s_(s), bytes_(bytes) {
    if (!bytes) return;
    const cudaError_t e = cudaMallocAsync(&p_, bytes, s);
    if (e != cudaSuccess) scratch_out_of_memory(e, bytes);
    note_scratch_bytes(p_, static_cast<int64_t>(bytes));
  }
  ~Scratch() {
    if (!p_) return;
    cudaFreeAsync(p_, s_);
    note_scratch_bytes(p_, -static_cast<int64_t>(bytes_));
  }
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;
  template <typename T>
  T *as() const {
    return static_cast<T *>(p_);
  }

 private:
  void *p_ = nullptr;
  cudaStream_t s_;
  size_t bytes_;
};

}  // namespace mt::cuda
