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
  // first use, and the events that order them with it. Two pools: `side` for work joined when
  // its op returns, `deferred` for work the compute stream waits for only at join_deferred().
  struct StreamPool {
    std::vector<cudaStream_t> streams;
    cudaEvent_t fork = nullptr;
    std::vector<cudaEvent_t> joins;
    std::vector<bool> pending;  // deferred pool: recorded since the last join_deferred()
  };
  StreamPool side, deferred;
  // What the deferred work reads: kept allocated until the compute stream has waited for it,
  // since the allocator orders reuse on the compute stream only.
  std::vector<std::shared_ptr<const void>> deferred_keep;
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
//
// Deferred: the work runs on a second pool of streams and `main` does not wait when the op
// returns, only at join_deferred() (the MoE experts' weight gradients, which nothing reads until
// the end of the backward pass, run beside the layers' backward after them). The deferred pool
// is separate so that the next op's joined side work never queues behind deferred work.
class SideStreams {
 public:
  enum class Join { AtEnd, Deferred };
  explicit SideStreams(cudaStream_t main, Join join = Join::AtEnd);
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;
  cudaStream_t next();

 private:
  cudaStream_t main_;
  Join join_;
  size_t next_ = 0, used_ = 0;
};

// Deferred side work: keep `t` allocated until join_deferred(); and make `main` wait for all the
// deferred work recorded so far, then release what it read.
void keep_until_joined(std::shared_ptr<const void> t);
void join_deferred(cudaStream_t main);

}  // namespace mt::cuda
