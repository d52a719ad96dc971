// argmax_rows on the GPU (ops.def), tested against kernels/cpu/argmax.cpp: a block per row, each
// thread keeping the best (value, index) of its strided columns, then a warp-shuffle and a
// shared-memory reduction. The rule (larger value wins, the lower index on ties, NaN never) is
// associative, so the reduction order does not change the answer.
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/device.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

struct Best {
  float v;
  int64_t i;  // -1: nothing seen (every value NaN so far)
};

__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

// The block's best of its threads' (a warp shuffle, then the warps in shared memory), written to
// out[blockIdx.x] (0 where every value was NaN).
template <int Threads>
__device__ __forceinline__ void write_block_best(Best b, int32_t* out) {
  for (int o = 16; o > 0; o >>= 1) {
    Best other;
    other.v = __shfl_down_sync(0xffffffffu, b.v, o);
    other.i = __shfl_down_sync(0xffffffffu, b.i, o);
    b = better(b, other);
  }
  __shared__ float sv[Threads / 32];
  __shared__ int64_t si[Threads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = b.v;
    si[warp] = b.i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Best r{sv[0], si[0]};
    for (int w = 1; w < Threads / 32; ++w) r = better(r, Best{sv[w], si[w]});
    out[blockIdx.x] = static_cast<int32_t>(r.i < 0 ? 0 : r.i);
  }
}

template <typename T>
__global__ void argmax_rows_kernel(const T* __restrict__ x, int32_t* __restrict__ out, int64_t ld, int64_t vocab) {
  const T* row = x + static_cast<int64_t>(blockIdx.x) * ld;
  Best b{-FLT_MAX, -1};
  for (int64_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float f = static_cast<float>(row[v]);
    if (!isnan(f)) b = better(b, Best{f, v});
  }
  write_block_best<kThreads>(b, out);
}

// The decode variant (ops::DecodeKernels): at batch 1 the row is the whole job, and the kernel
// above keeps only 8 warps x 64 bytes of it in flight, so the 256 KB row of a 128k vocabulary
// takes hundreds of L2 round trips. Here 1024 threads each issue kUnroll 16-byte loads before
// looking at any (64 KB in flight: the row in ~4 round trips). Same rule, hence the same answer.
constexpr int kWideThreads = 1024, kUnroll = 4;

template <typename T>
__global__ void __launch_bounds__(kWideThreads)
    argmax_rows_wide_kernel(const T* __restrict__ x, int32_t* __restrict__ out, int64_t ld, int64_t vocab) {
  constexpr int N = Vec<T>::N;
  const T* row = x + static_cast<int64_t>(blockIdx.x) * ld;
  const int64_t vecs = (vocab + N - 1) / N;  // ld % N == 0 (host check): the last vector stays in the row
  Best b{-FLT_MAX, -1};
  for (int64_t c0 = threadIdx.x; c0 < vecs; c0 += int64_t{kWideThreads} * kUnroll) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * kWideThreads;
      raw[u] = c < vecs ? __ldg(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + int64_t{u} * kWideThreads;
      if (c >= vecs) break;
      float f[N];
      Vec<T>::unpack(raw[u], f);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int64_t v = c * N + e;
        if (v < vocab && !isnan(f[e])) b = better(b, Best{f[e], v});
      }
    }
  }
  write_block_best<kWideThreads>(b, out);
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

Tensor argmax_rows(const Tensor& logits, int64_t vocab) {
  check_float_tensor(logits, "argmax_rows");
  MT_CHECK(logits.ndim() == 2 && vocab > 0 && vocab <= logits.dim(1),
           "argmax_rows: logits {} must be [rows, V'] with the vocabulary {} within V'", logits.shape_str(), vocab);
  const int64_t R = logits.dim(0);
  Tensor out = Tensor::empty({R}, DType::I32, Device::CUDA);
  if (R == 0) return out;
  MT_CHECK(R < (int64_t{1} << 31), "argmax_rows: {} rows exceed the grid", R);
  with_float_type(logits, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    // The decode kernel needs whole 16-byte vectors per row (ld a multiple of them, aligned rows).
    if (DecodeKernels::active() && logits.dim(1) % cuda::Vec<T>::N == 0 && cuda::aligned16(p)) {
      cuda::argmax_rows_wide_kernel<T><<<static_cast<unsigned>(R), cuda::kWideThreads, 0, cuda::compute_stream()>>>(
          logits.data<T>(), out.data<int32_t>(), logits.dim(1), vocab);
      MT_CUDA_LAUNCH_CHECK();
      return;
    }
    cuda::argmax_rows_kernel<T><<<static_cast<unsigned>(R), cuda::kThreads, 0, cuda::compute_stream()>>>(
        logits.data<T>(), out.data<int32_t>(), logits.dim(1), vocab);
    MT_CUDA_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace mt::ops::gpu
