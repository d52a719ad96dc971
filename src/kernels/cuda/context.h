#pragma once
// The backend's view of the live ops::GpuContext (kernels/device.h): what the CUDA ops need of
// the run's device. Host C++ and .cu files alike.
#include <cuda_runtime_api.h>

#include <memory>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"

namespace mt::ops {

struct GpuContext::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cuda::CudaAllocator* alloc = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
};

}  // namespace mt::ops

namespace mt::cuda {

// The live context's state; fails when the run made no GpuContext.
ops::GpuContext::Impl& context();
// The stream every op runs on.
inline cudaStream_t compute_stream() { return context().stream; }

}  // namespace mt::cuda
