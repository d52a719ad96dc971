// token_logprobs on the GPU (ops.def), tested against kernels/cpu/token_logprobs.cpp: a block per
// row, two passes over the row's real vocabulary (its max, then the sum of exp(x - max)), each a
// strided per-thread loop, a warp-shuffle and a shared-memory reduction. The row is read twice
// instead of once with an online rescaling: at a 128k vocabulary the second read comes from L2, and
// the plain max-then-sum keeps the reference's arithmetic.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

// The block's reduction of one value per thread with `op`; every thread gets the result.
template <typename Op>
__device__ float block_all_reduce(float v, Op op, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float r = shared[0];
    for (int w = 1; w < kThreads / 32; ++w) r = op(r, shared[w]);
    shared[0] = r;
  }
  __syncthreads();
  const float r = shared[0];
  __syncthreads();  // shared[] may be reused by the next reduction
  return r;
}

template <typename T>
__global__ void token_logprobs_kernel(const T* __restrict__ x, const int32_t* __restrict__ ids,
                                      float* __restrict__ out, int64_t ld, int64_t vocab) {
  __shared__ float shared[kThreads / 32];
  const T* row = x + static_cast<int64_t>(blockIdx.x) * ld;
  const int32_t id = ids[blockIdx.x];
  // fmaxf drops NaN here as std::fmax does in the reference; a NaN logit still reaches the sum.
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) mx = fmaxf(mx, to_f(row[v]));
  mx = block_all_reduce(mx, [](float a, float b) { return fmaxf(a, b); }, shared);
  float sum = 0.f;
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += expf(to_f(row[v]) - mx);
  sum = block_all_reduce(sum, [](float a, float b) { return a + b; }, shared);
  if (threadIdx.x == 0)
    out[blockIdx.x] = id >= 0 && id < vocab ? to_f(row[id]) - mx - logf(sum) : nanf("");
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

Tensor token_logprobs(const Tensor& logits, const Tensor& ids, int64_t vocab) {
  check_float_tensor(logits, "token_logprobs");
  MT_CHECK(logits.ndim() == 2 && vocab > 0 && vocab <= logits.dim(1),
           "token_logprobs: logits {} must be [rows, V'] with the vocabulary {} within V'", logits.shape_str(), vocab);
  const int64_t R = logits.dim(0);
  const int32_t* id = cuda_data<int32_t>(ids, DType::I32, R, "token_logprobs ids");
  Tensor out = Tensor::empty({R}, DType::F32, Device::CUDA);
  if (R == 0) return out;
  MT_CHECK(R < (int64_t{1} << 31), "token_logprobs: {} rows exceed the grid", R);
  with_float_type(logits, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    cuda::token_logprobs_kernel<T><<<static_cast<unsigned>(R), cuda::kThreads, 0, cuda::compute_stream()>>>(
        logits.data<T>(), id, out.data<float>(), logits.dim(1), vocab);
    MT_CUDA_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace mt::ops::gpu
