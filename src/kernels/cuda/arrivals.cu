// The last-block counters of dependent_launch.cuh: one pool per user and device, never freed (a
// few hundred KB for the process's life).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/dependent_launch.cuh"

namespace mt::cuda {

namespace {
constexpr int64_t kPoolInts = 1 << 16;
}

int* arrival_counters(ArrivalUser user, int64_t n, cudaStream_t s) {
  static std::mutex mu;
  static std::map<std::pair<int, ArrivalUser>, int*> pools;
  if (n > kPoolInts) return nullptr;
  int dev = 0;
  MT_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = pools.find({dev, user}); it != pools.end()) return it->second;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  if (st != cudaStreamCaptureStatusNone) return nullptr;
  int* p = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&p, kPoolInts * sizeof(int)));
  MT_CUDA_CHECK(cudaMemset(p, 0, kPoolInts * sizeof(int)));
  pools[{dev, user}] = p;
  return p;
}

}  // namespace mt::cuda
