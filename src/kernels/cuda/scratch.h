#pragma once
// Stream-ordered scratch memory for the CUDA kernels and their host-side
// drivers (plain C++, so host .cpp files such as the cuDNN graph code can use
// it too).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {

// Scratch from the device's default pool (the one CudaAllocator draws from),
// allocated and freed in stream order on `s`: no host synchronisation, reused
// by the pool in the steady state.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t s) : s_(s) {
    if (bytes) MT_CUDA_CHECK(cudaMallocAsync(&p_, bytes, s));
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, s_);
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
};

}  // namespace mt::cuda
