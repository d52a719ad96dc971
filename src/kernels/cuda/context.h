#pragma once
// The backend's view of the live ops::GpuContext (kernels/device.h): what the CUDA ops need of
// the run's device. Host C++ and .cu files alike.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"

namespace mt::ops {

struct GpuContext::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cuda::CudaAllocator* alloc = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
  // Streams that run independent GEMMs beside the compute stream (cuda::SideStreams), made on
  // first use, and the events that order them with it.
  std::vector<cudaStream_t> side;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> joins;
};

}  // namespace mt::ops

namespace mt::cuda {

// The live context's state; fails when the run made no GpuContext.
ops::GpuContext::Impl& context();
// The stream every op runs on.
inline cudaStream_t compute_stream() { return context().stream; }

// A fork/join over the context's side streams for one op: the constructor makes every side
// stream wait for `main`'s work so far; next() hands them out round robin; the destructor makes
// `main` wait for all of them. The side streams are MT_SIDE_STREAMS (1..8, default 4) non-blocking
// streams; with one, the work runs on `main` itself.
class SideStreams {
 public:
  explicit SideStreams(cudaStream_t main);
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;
  cudaStream_t next();

 private:
  cudaStream_t main_;
  size_t next_ = 0, used_ = 0;
};

}  // namespace mt::cuda
