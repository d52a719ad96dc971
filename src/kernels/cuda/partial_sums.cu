// The fixed-order partial-row sum behind the deterministic column reductions (common.cuh).
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

constexpr int kCols = 32, kGroups = 16;

__global__ void __launch_bounds__(kCols* kGroups)
    partial_rows_sum_add_kernel(const float* __restrict__ part, float* __restrict__ out, int64_t chunks, int64_t dim) {
  __shared__ float sums[kGroups][kCols + 1];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kCols) + threadIdx.x;
  float acc = 0.f;
  if (j < dim) {
#pragma unroll 4
    for (int64_t c = threadIdx.y; c < chunks; c += kGroups) acc += part[c * dim + j];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || j >= dim) return;
  float total = 0.f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) total += sums[g][threadIdx.x];
  out[j] += total;
}

}  // namespace

void partial_rows_sum_add(const float* part, float* out, int64_t chunks, int64_t dim, cudaStream_t s) {
  if (dim == 0) return;
  partial_rows_sum_add_kernel<<<static_cast<unsigned>(ceil_div(dim, kCols)), dim3(kCols, kGroups), 0, s>>>(part, out,
                                                                                                           chunks, dim);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
