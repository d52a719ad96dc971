// The loss head's bookkeeping on the GPU (upload, scaled_mask, accumulate_masked_loss of
// ops.def): asynchronous uploads through a pinned staging pool, the masked loss sum into an fp64
// device accumulator, and dloss from the device mask. Nothing here synchronises the host.
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kSumThreads = 1024;

// One block: each thread sums a fixed strided subset in order, then the block's fixed tree.
__global__ void masked_sum_kernel(const float* __restrict__ losses, const float* __restrict__ mask, int64_t n,
                                  double* __restrict__ acc) {
  __shared__ double sh[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(losses[i]) * mask[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *acc += s;
}

__global__ void scale_copy_kernel(const float* __restrict__ x, float* __restrict__ y, float scale, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = x[i] * scale;
}

// Pinned host blocks for uploads. A block is reused once the copy that last read it has
// finished (its event); while every block is busy the pool grows, up to kMaxBlocks, after which
// the host waits for the oldest use: a bound on how far it may run ahead of the device.
class StagingPool {
 public:
  struct Block {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
  };

  // Returns a block of at least `bytes` that no pending copy reads. Holds the pool's lock
  // through `use`, which must enqueue the copy and record the block's event.
  template <typename Use>
  void with_block(size_t bytes, Use&& use) {
    std::lock_guard<std::mutex> lock(mu_);
    Block* b = nullptr;
    for (Block& c : blocks_)
      if (done(c)) {
        b = &c;
        break;
      }
    if (!b && blocks_.size() < kMaxBlocks) {
      blocks_.emplace_back();
      b = &blocks_.back();
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&b->copied, cudaEventDisableTiming));
    }
    if (!b) {
      b = &blocks_[next_wait_];
      next_wait_ = (next_wait_ + 1) % blocks_.size();
      MT_CUDA_CHECK(cudaEventSynchronize(b->copied));
    }
    if (b->capacity < bytes) {
      if (b->host) MT_CUDA_CHECK(cudaFreeHost(b->host));
      b->host = nullptr;
      b->capacity = 0;
      const size_t cap = std::max<size_t>(bytes, size_t{64} << 10);
      MT_CUDA_CHECK(cudaHostAlloc(&b->host, cap, cudaHostAllocDefault));
      b->capacity = cap;
    }
    use(*b);
  }

 private:
  static constexpr size_t kMaxBlocks = 64;
  // A block whose event was never recorded, or has completed, is free.
  static bool done(const Block& b) {
    const cudaError_t e = cudaEventQuery(b.copied);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is a state, not an error: keep it out of later checks
      return false;
    }
    check_cuda(e, "cudaEventQuery(staging block)", __FILE__, __LINE__);
    return false;
  }

  std::mutex mu_;
  std::vector<Block> blocks_;  // never shrinks while in use: held pointers stay valid under the lock
  size_t next_wait_ = 0;
};

StagingPool& staging_pool() {
  static StagingPool* p = new StagingPool;  // lives for the process, like the allocator
  return *p;
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {
namespace {

using cuda::compute_stream;

}  // namespace

Tensor upload(const void* host, const Shape& shape, DType dtype, Device device) {
  MT_CHECK(device == Device::CUDA, "upload: the GPU implementation asked for a CPU tensor");
  Tensor t = Tensor::empty(shape, dtype, Device::CUDA);
  const size_t bytes = t.nbytes();
  if (bytes == 0) return t;
  const cudaStream_t s = compute_stream();
  cuda::staging_pool().with_block(bytes, [&](cuda::StagingPool::Block& b) {
    std::memcpy(b.host, host, bytes);
    MT_CUDA_CHECK(cudaMemcpyAsync(t.raw(), b.host, bytes, cudaMemcpyHostToDevice, s));
    MT_CUDA_CHECK(cudaEventRecord(b.copied, s));
  });
  return t;
}

void accumulate_masked_loss(const Tensor& losses, const Tensor& mask, Tensor& acc) {
  check_masked_loss(losses, mask, acc, Device::CUDA);
  const int64_t n = losses.numel();
  cuda::masked_sum_kernel<<<1, cuda::kSumThreads, 0, compute_stream()>>>(losses.data<float>(), mask.data<float>(), n,
                                                                         static_cast<double*>(acc.raw()));
  MT_CUDA_LAUNCH_CHECK();
}

Tensor scaled_mask(const Tensor& mask, float scale) {
  const int64_t n = mask.numel();
  check_vector(mask, Device::CUDA, DType::F32, n, "scaled_mask");
  Tensor out = Tensor::empty({n}, DType::F32, Device::CUDA);
  if (n == 0) return out;
  cuda::scale_copy_kernel<<<cuda::grid_for(n, 256), 256, 0, compute_stream()>>>(mask.data<float>(), out.data<float>(),
                                                                                 scale, n);
  MT_CUDA_LAUNCH_CHECK();
  return out;
}

}  // namespace mt::ops::gpu
