// Ring attention's log-sum-exp merge on the GPU (ops.def: attention_merge): one thread per
// (row, channel); the weights in fp32 from the two lse values, the output rounded once to its
// storage type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

template <typename T>
__global__ void merge_out_kernel(T* __restrict__ out, const float* __restrict__ lse, const T* __restrict__ part,
                                 const float* __restrict__ part_lse, int64_t rows, int64_t D) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * D) return;
  const int64_t r = i / D;
  const float a = isinf(lse[r]) && lse[r] > 0 ? -INFINITY : lse[r];
  const float b = isinf(part_lse[r]) && part_lse[r] > 0 ? -INFINITY : part_lse[r];
  const float m = fmaxf(a, b);
  if (m == -INFINITY) return;
  const float wa = expf(a - m), wb = expf(b - m), sum = wa + wb;
  out[i] = static_cast<T>((wa / sum) * static_cast<float>(out[i]) + (wb / sum) * static_cast<float>(part[i]));
}

// After the outputs (which read the old lse): the merged lse per row.
__global__ void merge_lse_kernel(float* __restrict__ lse, const float* __restrict__ part_lse, int64_t rows) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float a = isinf(lse[r]) && lse[r] > 0 ? -INFINITY : lse[r];
  const float b = isinf(part_lse[r]) && part_lse[r] > 0 ? -INFINITY : part_lse[r];
  const float m = fmaxf(a, b);
  if (m == -INFINITY) return;
  lse[r] = m + logf(expf(a - m) + expf(b - m));
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) {
  MT_CHECK(out.shape() == part_out.shape() && lse.shape() == part_lse.shape() && out.ndim() == 4 &&
               out.dtype() == part_out.dtype() && lse.numel() * out.dim(3) == out.numel() &&
               lse.dtype() == DType::F32 && part_lse.dtype() == DType::F32,
           "attention_merge: out {} / lse {} and part {} / {} do not match", out.shape_str(), lse.shape_str(),
           part_out.shape_str(), part_lse.shape_str());
  const int64_t rows = lse.numel(), D = out.dim(3), n = rows * D;
  if (n == 0) return;
  cudaStream_t st = cuda::compute_stream();
  const int threads = 256;
  const auto blocks = static_cast<unsigned>((n + threads - 1) / threads);
  switch (out.dtype()) {
    case DType::F32:
      cuda::merge_out_kernel<<<blocks, threads, 0, st>>>(out.data<float>(), lse.data<float>(), part_out.data<float>(),
                                                         part_lse.data<float>(), rows, D);
      break;
    case DType::BF16:
      cuda::merge_out_kernel<<<blocks, threads, 0, st>>>(out.data<__nv_bfloat16>(), lse.data<float>(),
                                                         part_out.data<__nv_bfloat16>(), part_lse.data<float>(), rows, D);
      break;
    case DType::F16:
      cuda::merge_out_kernel<<<blocks, threads, 0, st>>>(out.data<__half>(), lse.data<float>(),
                                                         part_out.data<__half>(), part_lse.data<float>(), rows, D);
      break;
    default: MT_CHECK(false, "attention_merge: unsupported dtype {}", dtype_name(out.dtype()));
  }
  MT_CUDA_LAUNCH_CHECK();
  cuda::merge_lse_kernel<<<static_cast<unsigned>((rows + threads - 1) / threads), threads, 0, st>>>(
      lse.data<float>(), part_lse.data<float>(), rows);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::gpu
