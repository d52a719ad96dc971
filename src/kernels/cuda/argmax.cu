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
#include "kernels/cuda/dependent_launch.cuh"
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

// The block's best of its threads' (a warp shuffle, then the warps in shared memory), returned to
// thread 0 (other threads: their warp's).
template <int Threads>
__device__ __forceinline__ Best block_best(Best b) {
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
  if (threadIdx.x == 0)
    for (int w = 1; w < Threads / 32; ++w) b = better(b, Best{sv[w], si[w]});
  return b;
}

// The block's best written to out[blockIdx.x] (0 where every value was NaN).
template <int Threads>
__device__ __forceinline__ void write_block_best(Best b, int32_t* out) {
  b = block_best<Threads>(b);
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(b.i < 0 ? 0 : b.i);
}

// Thread t's best of the 16-byte vectors c0 + t, c0 + t + Threads, ... below `end` (Unroll loads in
// flight before any is looked at).
template <typename T, int Threads, int Unroll>
__device__ __forceinline__ Best scan_vectors(const T* row, int64_t begin, int64_t end, int64_t vocab) {
  constexpr int N = Vec<T>::N;
  Best b{-FLT_MAX, -1};
  for (int64_t c0 = begin + threadIdx.x; c0 < end; c0 += int64_t{Threads} * Unroll) {
    uint4 raw[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int64_t c = c0 + int64_t{u} * Threads;
      raw[u] = c < end ? __ldg(reinterpret_cast<const uint4*>(row) + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int64_t c = c0 + int64_t{u} * Threads;
      if (c >= end) break;
      float f[N];
      Vec<T>::unpack(raw[u], f);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const int64_t v = c * N + e;
        if (v < vocab && !isnan(f[e])) b = better(b, Best{f[e], v});
      }
    }
  }
  return b;
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
  const T* row = x + static_cast<int64_t>(blockIdx.x) * ld;
  const int64_t vecs = (vocab + Vec<T>::N - 1) / Vec<T>::N;  // ld % N == 0 (host check): the last vector stays in the row
  write_block_best<kWideThreads>(scan_vectors<T, kWideThreads, kUnroll>(row, 0, vecs, vocab), out);
}

// Decode (up to kSplitMaxRows rows): the wide kernel's one block per row took 22 us for a 128k vocabulary on an
// H200 (ncu, session 17): one SM's loads. Here each row is split over gridDim.x blocks of 256
// threads, each one round of 4 loads per thread (16 KB), launched as a programmatic dependent of
// the output layer's GEMV (dependent_launch.cuh); each block leaves its best in part, and the
// last of a row's blocks to arrive (a counter per row) takes the best of the row's parts and
// resets the counter. The rule is associative, so the answer is the wide kernel's.
constexpr int kSplitThreads = 256, kSplitUnroll = 4;
constexpr int64_t kSplitVecs = int64_t{kSplitThreads} * kSplitUnroll;  // per block

template <typename T>
__global__ void __launch_bounds__(kSplitThreads)
    argmax_rows_split_kernel(const T* __restrict__ x, int32_t* __restrict__ out, int64_t ld, int64_t vocab,
                             float* __restrict__ part_v, int64_t* __restrict__ part_i, int* __restrict__ arrivals) {
  const int64_t r = blockIdx.y, splits = gridDim.x;
  const int64_t vecs = (vocab + Vec<T>::N - 1) / Vec<T>::N;
  const int64_t begin = blockIdx.x * kSplitVecs, end = min(vecs, begin + kSplitVecs);
  wait_for_previous_grid();  // the logits come from the output layer's GEMV
  Best b = block_best<kSplitThreads>(scan_vectors<T, kSplitThreads, kSplitUnroll>(x + r * ld, begin, end, vocab));
  if (threadIdx.x == 0) {
    part_v[r * splits + blockIdx.x] = b.v;
    part_i[r * splits + blockIdx.x] = b.i;
    __threadfence();  // the part visible to the whole device before this block counts
    if (atomicAdd(arrivals + r, 1) == splits - 1) {
      arrivals[r] = 0;  // every block of the row has arrived: ready for the next launch
      __threadfence();
      Best best{-FLT_MAX, -1};
      for (int64_t k = 0; k < splits; ++k) best = better(best, Best{part_v[r * splits + k], part_i[r * splits + k]});
      out[r] = static_cast<int32_t>(best.i < 0 ? 0 : best.i);
    }
  }
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

// Rows up to which decode's argmax splits each row over blocks (decode's batch sizes; a grid row each).
constexpr int64_t kSplitMaxRows = 64;

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
    const bool vectors = logits.dim(1) % cuda::Vec<T>::N == 0 && cuda::aligned16(p);
    if (DecodeKernels::active() && vectors && R <= kSplitMaxRows) {
      const int64_t splits = cuda::ceil_div(cuda::ceil_div(vocab, cuda::Vec<T>::N), cuda::kSplitVecs);
      int* arrivals = cuda::arrival_counters(cuda::ArrivalUser::DecodeArgmax, R, cuda::compute_stream());
      if (arrivals && splits < 65536) {
        cuda::Scratch part_v(static_cast<size_t>(R * splits) * sizeof(float), cuda::compute_stream());
        cuda::Scratch part_i(static_cast<size_t>(R * splits) * sizeof(int64_t), cuda::compute_stream());
        cuda::launch_dependent(cuda::argmax_rows_split_kernel<T>,
                               dim3(static_cast<unsigned>(splits), static_cast<unsigned>(R)), dim3(cuda::kSplitThreads),
                               cuda::compute_stream(), logits.data<T>(), out.data<int32_t>(), logits.dim(1), vocab,
                               part_v.as<float>(), part_i.as<int64_t>(), arrivals);
        return;
      }
    }
    if (DecodeKernels::active() && vectors) {
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
