#pragma once
// Helpers shared by the CUDA kernels: launch checks, bf16/fp16/fp32 loads and stores in 16-byte
// vectors, warp and block reductions with a fixed order, stream-ordered scratch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/scratch.h"

namespace mt::cuda {

#define MT_CUDA_LAUNCH_CHECK() ::mt::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// Explicit instantiation of the launcher template `fn` (declared in ops_cuda.h) for the given
// template arguments, in the .cu file that defines it. The function type comes from the
// declaration, so the signature stays written once.
#define MT_INSTANTIATE(fn, ...) template decltype(fn<__VA_ARGS__>) fn<__VA_ARGS__>
// ... for each storage type (bf16, fp16, fp32), and for the two half types.
#define MT_INSTANTIATE_STORAGE(fn) \
  MT_INSTANTIATE(fn, bf16);        \
  MT_INSTANTIATE(fn, f16);         \
  MT_INSTANTIATE(fn, float)
#define MT_INSTANTIATE_HALF(fn) \
  MT_INSTANTIATE(fn, bf16);     \
  MT_INSTANTIATE(fn, f16)
// ... and of a two-type template with each storage type as both (fn<bf16, bf16>, ...).
#define MT_INSTANTIATE_STORAGE2(fn) \
  MT_INSTANTIATE(fn, bf16, bf16);   \
  MT_INSTANTIATE(fn, f16, f16);     \
  MT_INSTANTIATE(fn, float, float)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Grid size for a grid-stride elementwise loop: enough blocks to fill the GPU, no more.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65536) {
  int64_t b = ceil_div(n, threads);
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<unsigned>(b);
}

// ---- scalar conversions
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
// IEEE half: round to nearest even, overflow to +-inf (as the CPU's f32_to_f16).
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

// ---- 16-byte vectors: Vec<T>::N elements of T loaded/stored as one 16-byte access.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int N = 4;
  // unpack: one 16-byte group already in registers (a uint4), as fp32 values.
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    out[0] = __uint_as_float(v.x), out[1] = __uint_as_float(v.y), out[2] = __uint_as_float(v.z);
    out[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static void load(const float* p, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
  __device__ __forceinline__ static void store(float* p, const float* in) {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int N = 8;
  __device__ __forceinline__ static void load(const __nv_bfloat16* p, float* out) {
    unpack(*reinterpret_cast<const uint4*>(p), out);
  }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  __device__ __forceinline__ static void store(__nv_bfloat16* p, const float* in) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

template <>
struct Vec<__half> {
  static constexpr int N = 8;
  __device__ __forceinline__ static void load(const __half* p, float* out) {
    unpack(*reinterpret_cast<const uint4*>(p), out);
  }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ __forceinline__ static void store(__half* p, const float* in) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
      w[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Loads/stores a group of `cnt` (<= G) consecutive elements as fp32: G / Vec<T>::N 16-byte
// accesses when the group is full and `vec` (the caller checked alignment), else scalars.
// G defaults to one vector; a larger G lets two types of different widths share a group.
template <typename T, int G = Vec<T>::N>
__device__ __forceinline__ void load_group(const T* p, int cnt, bool vec, float* out) {
  static_assert(G % Vec<T>::N == 0, "a group is a whole number of 16-byte vectors");
  if (vec && cnt == G) {
#pragma unroll
    for (int k = 0; k < G; k += Vec<T>::N) Vec<T>::load(p + k, out + k);
  } else {
#pragma unroll
    for (int e = 0; e < G; ++e)
      if (e < cnt) out[e] = to_f(p[e]);
  }
}
template <typename T, int G = Vec<T>::N>
__device__ __forceinline__ void store_group(T* p, int cnt, bool vec, const float* in) {
  static_assert(G % Vec<T>::N == 0, "a group is a whole number of 16-byte vectors");
  if (vec && cnt == G) {
#pragma unroll
    for (int k = 0; k < G; k += Vec<T>::N) Vec<T>::store(p + k, in + k);
  } else {
#pragma unroll
    for (int e = 0; e < G; ++e)
      if (e < cnt) p[e] = from_f<T>(in[e]);
  }
}

// ---- RoPE (rotate-half): one pair, x1 at i < half and x2 at i + half, with si = sign * sin
// (sign -1 rotates back). Shared by the RoPE kernel and the QKV layout kernels that fuse it, so
// both round alike: o1 as plain mul, mul, sub; o2 with x1 * si rounded before the fused
// multiply-add, spelled out so the choice does not depend on how a caller's loop compiles.
__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float si, float& o1, float& o2) {
  o1 = x1 * c - x2 * si;
  o2 = __fmaf_rn(x2, c, __fmul_rn(x1, si));
}

// ---- SwiGLU's math in fp32, shared by its kernels (elementwise.cu) and the FP8 casts that fuse
// it (fp8.cu): one definition, so both compute the same bits. g: the gate, u: the up half.
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float swiglu_value(float g, float u) { return g * sigmoidf_(g) * u; }
// The gradients of the gate and up halves from the output's gradient d.
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float& dg, float& du) {
  const float sg = sigmoidf_(g);
  du = d * g * sg;
  dg = d * u * sg * (1.f + g * (1.f - sg));
}

// ---- Programmatic dependent launch (Hopper). Called first in the kernels that precede a decode
// step's GEMVs (norms, SwiGLU, decode attention): a GEMV launched after one as a programmatic
// dependent (gemv.cu) may start its blocks now, prefetch its weights into L2, and then wait for
// this grid's completion and writes. Kernels launched normally after it wait as always: a no-op.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// ---- reductions (fixed butterfly order: deterministic)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Non-negative floats order as their bit patterns: an integer atomicMax is a float max (and, max
// being order-free, the result does not depend on the launch).
__device__ __forceinline__ void atomic_max_nonneg(float* p, float v) {
  atomicMax(reinterpret_cast<int*>(p), __float_as_int(v));
}
// m joined with max |v[e]| over the first cnt of N values as stored in T (rounded from fp32: the
// amax of the tensor its consumer reads). fmaxf drops NaN, as the CPU's std::fmax.
template <typename T, int N>
__device__ __forceinline__ float stored_amax(float m, const float* v, int cnt) {
#pragma unroll
  for (int e = 0; e < N; ++e)
    if (e < cnt) m = fmaxf(m, fabsf(to_f(from_f<T>(v[e]))));
  return m;
}
// Joins each thread's running max |x| into *amax (an FP8 amax, zeroed before the launch): the
// warp's max, one atomic per warp. Every lane of the warp must call it.
__device__ __forceinline__ void commit_amax(float m, float* amax) {
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) atomic_max_nonneg(amax, m);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `sh` holds 32 values. Warp sums, then warp 0 sums the warp sums in order.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T t = lane < nw ? sh[lane] : T(0);
    t = warp_sum(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

// out[j] += sum over c of part[c * dim + j], c in [0, chunks): the second stage of the
// deterministic column reductions (norm dw/db, bias db), whose first stage writes one partial
// row per fixed chunk of rows. Chunks are split over 16 thread rows per column (fixed
// assignment, each summed in order) and the 16 sums added in order: a fixed result that no
// longer walks every chunk from one thread per column (latency bound for hidden-size columns).
void partial_rows_sum_add(const float* part, float* out, int64_t chunks, int64_t dim, cudaStream_t s);

}  // namespace mt::cuda
