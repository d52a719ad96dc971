#pragma once
// Programmatic dependent launch (Hopper), for decode's chain of small kernels (issue #22): a
// kernel launched with launch_dependent may start its blocks while the kernel before it on the
// stream drains (once all of that one's blocks have called allow_dependent_launch, common.cuh),
// do the work that does not depend on it (load or prefetch weights, read the KV cache's older
// positions), and only then call wait_for_previous_grid, which waits for that grid's completion
// and the visibility of its writes. Inside a CUDA graph the launch becomes a programmatic edge.
// On older GPUs the attribute is left off and the launch is an ordinary one.
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/common.cuh"

namespace mt::cuda {

// Waits for the grid this one depends on programmatically (a no-op when launched normally).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A 128-byte line into L2 (what a dependent kernel fetches before its wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Programmatic dependent launches need compute capability 9.0 (Hopper) or newer.
inline bool dependent_launch_supported() {
  static const bool on = [] {
    int dev = 0, major = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return on;
}

// kernel<<<grid, block, smem, s>>>(args...) with one launch attribute (none where `on` is false).
template <typename... Params, typename... Args>
void launch_with(cudaLaunchAttribute attr, bool on, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                 cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = on ? 1 : 0;
  MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  MT_CUDA_LAUNCH_CHECK();
}

// kernel<<<grid, block, 0, s>>>(args...) as a programmatic dependent of the stream's last kernel.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t s, Args&&... args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  launch_with(attr, dependent_launch_supported(), kernel, grid, block, 0, s, std::forward<Args>(args)...);
}

// A cooperative launch: refused unless every block can be resident at once (a grid barrier's need).
template <typename... Params, typename... Args>
void launch_cooperative(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                        Args&&... args) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  launch_with(attr, true, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

// Counters for kernels whose last block to finish does a final step (a split merge, the last
// reduction), found with an atomicAdd on the counter of its row: n ints per user and device,
// zeroed once; every launch leaves them zero (the last block resets its own). Allocated on first
// use outside a stream capture (a decode graph's eager step comes first); null where that is not
// possible (during a capture, or n over the pool's size): the caller then takes a path without.
enum class ArrivalUser { DecodeAttention, DecodeArgmax, DecodeStack };
int* arrival_counters(ArrivalUser user, int64_t n, cudaStream_t s);

}  // namespace mt::cuda
