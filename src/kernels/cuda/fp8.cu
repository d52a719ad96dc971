// FP8 ops of ops.def on the GPU: amax reductions into a device scalar, the scale updates (one
// thread: a handful of floats, kept on the device so the step never waits for the host), and
// the quantize-and-read-back that the CPU emulates exactly (cvt.rn.satfinite: round to nearest
// even, saturating, as Transformer Engine casts). The scale rules are kernels/fp8_scale.h's,
// shared with the CPU.
#include <cuda_fp8.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_cast_kernel.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/tensor_args.h"
#include "kernels/fp8_scale.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

// 8 consecutive elements (16-byte aligned) as loaded, in one or two 16-byte vectors: a kernel
// that issues many loads before using any keeps them in this form (4 registers for bf16), not as
// 8 floats each.
template <typename T>
struct Raw8 {
  uint4 w[sizeof(T) / 2];
};
template <typename T>
__device__ __forceinline__ Raw8<T> fetch8(const T* p) {
  Raw8<T> r;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 2); ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}
template <typename T>
__device__ __forceinline__ void unpack8(const Raw8<T>& r, float* v) {
  const T* e = reinterpret_cast<const T*>(r.w);
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = to_f(e[k]);
}
// The 8 elements at p as floats.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float* v) {
  unpack8(fetch8(p), v);
}

template <typename T>
__global__ void amax_kernel(const T* __restrict__ x, int64_t n, float* amax) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    m = fmaxf(m, fabsf(to_f(x[i])));  // fmaxf drops NaN, as the CPU's std::fmax
  commit_amax(m, amax);
}

// Joins a block's running max |x| and clipped count into *amax (unless null: the amax is known
// already) and *saturated with one atomic each: a 256 MB gradient is thousands of blocks, and
// same-address atomics queue at one L2 slice (per-warp atomics were 8x as many).
__device__ __forceinline__ void commit_block(float m, unsigned clipped, float* amax, unsigned long long* saturated) {
  __shared__ float block_max[kVecThreads / 32];
  __shared__ unsigned block_clipped[kVecThreads / 32];
  m = warp_max(m);
  for (int o = 16; o > 0; o >>= 1) clipped += __shfl_xor_sync(0xffffffffu, clipped, o);
  if ((threadIdx.x & 31) == 0) {
    block_max[threadIdx.x / 32] = m;
    block_clipped[threadIdx.x / 32] = clipped;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float bm = 0.f;
  unsigned long long bc = 0;
  for (int w = 0; w < kVecThreads / 32; ++w) {
    bm = fmaxf(bm, block_max[w]);
    bc += block_clipped[w];
  }
  if (amax) atomic_max_nonneg(amax, bm);
  if (saturated && bc) atomicAdd(saturated, bc);
}

// The same over 8-element vectors, for the vector-aligned tensors of the FP8 path: tensorwise
// scaling runs this pass before many casts, so it should stream at memory bandwidth. Each thread
// keeps 4 loads (64 bytes of bf16) in flight per round, and a block commits once (commit_block):
// one wave of resident blocks (resident_blocks()) strides over the tensor. n8 = n / 8 vectors.
constexpr int kAmaxUnroll = 4;
template <typename T>
__global__ void __launch_bounds__(kVecThreads) amax_vec_kernel(const T* __restrict__ x, int64_t n8, float* amax) {
  float m = 0.f;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + (kAmaxUnroll - 1) * stride < n8; i += kAmaxUnroll * stride) {
    float v[kAmaxUnroll][8];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) load8(x + 8 * (i + u * stride), v[u]);
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u)
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[u][k]));
  }
  for (; i < n8; i += stride) {
    float v[8];
    load8(x + 8 * i, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[k]));
  }
  commit_block(m, 0, amax, nullptr);
}

__global__ void delayed_update_kernel(float* h, int64_t L, float* scale, const float* amax, float scaled_max,
                                      bool use_max) {
  h[0] = *amax;
  float a = h[0];
  if (use_max)
    for (int64_t i = 1; i < L; ++i) a = fmaxf(a, h[i]);
  *scale = fp8::scale_from_amax(a, scaled_max, *scale);
  const float first = h[0];
  for (int64_t i = 0; i + 1 < L; ++i) h[i] = h[i + 1];
  h[L - 1] = first;
  h[0] = 0.f;
}

__global__ void current_scale_kernel(const float* amax, float* scale, float fp8_max) {
  *scale = fp8::scale_from_amax(*amax, fp8_max, 1.f);
}

__global__ void snapshot_scale_kernel(const float* scale, float* used, float* used_inv) {
  const float s = *scale;
  *used = s;
  *used_inv = 1.f / s;
}

__device__ __forceinline__ float fp8_round_dev(float v, bool e5m2) {
  const __nv_fp8_interpretation_t k = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, k);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, k)));
}

template <typename T>
__global__ void fake_quantize_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, const float* scale,
                                     bool e5m2, float fp8_max, unsigned long long* saturated) {
  const float s = *scale, inv = 1.f / s;
  unsigned clipped = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = to_f(x[i]) * s;
    clipped += fabsf(v) > fp8_max;
    y[i] = from_f<T>(fp8_round_dev(v, e5m2) * inv);
  }
  for (int o = 16; o > 0; o >>= 1) clipped += __shfl_xor_sync(0xffffffffu, clipped, o);
  if ((threadIdx.x & 31) == 0 && clipped) atomicAdd(saturated, static_cast<unsigned long long>(clipped));
}

// One block per tile: the tile's amax (block max), its power-of-two scale, then the tile.
template <typename T>
__global__ void fake_quantize_blocks_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t R, int64_t C,
                                            int64_t tile_r, int64_t tile_c, int64_t tiles_c, bool e5m2, float fp8_max,
                                            float* scales) {
  __shared__ float warp_maxes[kThreads / 32];
  const int64_t bi = blockIdx.x / tiles_c, bj = blockIdx.x % tiles_c;
  const int64_t r0 = bi * tile_r, c0 = bj * tile_c;
  const int64_t h = min(tile_r, R - r0), w = min(tile_c, C - c0), n = h * w;
  float m = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, fabsf(to_f(x[(r0 + i / w) * C + c0 + i % w])));
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) warp_maxes[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0.f;
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, warp_maxes[i]);
  const float s = fp8::block_scale(m, fp8_max), inv = 1.f / s;
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t at = (r0 + i / w) * C + c0 + i % w;
    y[at] = from_f<T>(fp8_round_dev(to_f(x[at]) * s, e5m2) * inv);
  }
}

// One 32x32 tile per block (32 x 8 threads): codes written row-major, and through shared memory
// transposed, both coalesced; the tile's amax and clipped count joined atomically.
constexpr int kTileDim = 32, kTileRows = 8;
template <typename T>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t R, int64_t C, const float* scale, bool e5m2,
                                      float fp8_max, uint8_t* __restrict__ q, uint8_t* __restrict__ qt, float* amax,
                                      unsigned long long* saturated) {
  __shared__ uint8_t tile[kTileDim][kTileDim + 1];
  const float s = *scale;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int64_t r0 = int64_t{blockIdx.y} * kTileDim, c0 = int64_t{blockIdx.x} * kTileDim;
  float m = 0.f;
  unsigned clipped = 0;
  for (int i = threadIdx.y; i < kTileDim; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < R && c < C) {
      const float v = to_f(x[r * C + c]);
      m = fmaxf(m, fabsf(v));
      clipped += fabsf(v * s) > fp8_max;
      const uint8_t code = __nv_cvt_float_to_fp8(v * s, __NV_SATFINITE, kind);
      if (q) q[r * C + c] = code;
      tile[i][threadIdx.x] = code;
    }
  }
  m = warp_max(m);
  for (int o = 16; o > 0; o >>= 1) clipped += __shfl_xor_sync(0xffffffffu, clipped, o);
  if (threadIdx.x == 0) {
    atomic_max_nonneg(amax, m);
    if (clipped) atomicAdd(saturated, static_cast<unsigned long long>(clipped));
  }
  if (!qt) return;
  __syncthreads();
  for (int i = threadIdx.y; i < kTileDim; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // qt[c, r] = q[r, c]
    if (r < R && c < C) qt[c * R + r] = tile[threadIdx.x][i];
  }
}

// The same, vectorised, for the GPU FP8 path's tensors (both dimensions multiples of 8, x 16-byte
// aligned): 256 x 64 tiles of 256 threads, each lane an 8x8 block (fp8_tile.cuh), every global
// access a vector covering whole sectors. This pass is the FP8 step's overhead over bf16: it has
// to run near memory bandwidth, so each lane keeps 128 bytes of loads in flight (the 64x64 shared
// memory tile it replaces had 32, and blocks too short to overlap their loads with their stores).
//
// The elements come from a loader in two steps: raw = load.fetch(r, c) issues the loads of row r,
// columns c..c+7 (all a lane's rows are fetched before any is used: the loads stay in flight
// together), load.values(raw, c, v) turns them into the 8 values as fp32. A plain cast loads them
// from x; the fused casts (FP8 producer fusion, ops.def) compute them from the producer's inputs
// (SwiGLU's h, its backward's dy and h) and round them to the storage type exactly as the
// producer's own kernel stores them, so the codes are those of the unfused path bit for bit,
// without the tensor ever written in bf16 or read back.

template <typename T>
struct PlainLoad {
  const T* __restrict__ x;
  int64_t C;
  using Raw = Raw8<T>;
  __device__ __forceinline__ Raw fetch(int64_t r, int64_t c) const { return fetch8(x + r * C + c); }
  __device__ __forceinline__ void values(const Raw& raw, int64_t, float* v) const { unpack8(raw, v); }
};

// SwiGLU's output a [R, F] = silu(gate) * up from h [R, 2F] = [gate | up], stored as T.
template <typename T>
struct SwigluLoad {
  const T* __restrict__ h;
  int64_t F;
  struct Raw {
    Raw8<T> g, u;
  };
  __device__ __forceinline__ Raw fetch(int64_t r, int64_t c) const {
    return {fetch8(h + r * 2 * F + c), fetch8(h + r * 2 * F + F + c)};
  }
  __device__ __forceinline__ void values(const Raw& raw, int64_t, float* v) const {
    float g[8], u[8];
    unpack8(raw.g, g);
    unpack8(raw.u, u);
    for (int k = 0; k < 8; ++k) v[k] = to_f(from_f<T>(swiglu_value(g[k], u[k])));
  }
};

// The gate's and the up half's gradients of row r, output columns j..j+7, from dy [R, F] and
// h [R, 2F], rounded to T as swiglu_backward stores them.
template <typename T>
__device__ __forceinline__ void swiglu_grads8(const T* __restrict__ dy, const T* __restrict__ h, int64_t F, int64_t r,
                                              int64_t j, float* dg, float* du) {
  float d[8], g[8], u[8];
  load8(dy + r * F + j, d);
  load8(h + r * 2 * F + j, g);
  load8(h + r * 2 * F + F + j, u);
  for (int k = 0; k < 8; ++k) {
    swiglu_grads(d[k], g[k], u[k], dg[k], du[k]);
    dg[k] = to_f(from_f<T>(dg[k]));
    du[k] = to_f(from_f<T>(du[k]));
  }
}

// SwiGLU's input gradient dh [R, 2F] = [d gate | d up] from the output's gradient dy [R, F] and h:
// columns below F are the gate's (F % 8 == 0: a vector never straddles the halves). The other
// half's tiles re-read dy and the gate, mostly from L2 (the tiles of a row band run together).
template <typename T>
struct SwigluGradLoad {
  const T* __restrict__ dy;
  const T* __restrict__ h;
  int64_t F;
  struct Raw {
    Raw8<T> d, g, u;
  };
  __device__ __forceinline__ Raw fetch(int64_t r, int64_t c) const {
    const int64_t j = c < F ? c : c - F;
    return {fetch8(dy + r * F + j), fetch8(h + r * 2 * F + j), fetch8(h + r * 2 * F + F + j)};
  }
  __device__ __forceinline__ void values(const Raw& raw, int64_t c, float* v) const {
    const bool gate = c < F;
    float d[8], g[8], u[8];
    unpack8(raw.d, d);
    unpack8(raw.g, g);
    unpack8(raw.u, u);
    for (int k = 0; k < 8; ++k) {
      float dg, du;
      swiglu_grads(d[k], g[k], u[k], dg, du);  // swiglu_grads8's expression, one half kept
      v[k] = to_f(from_f<T>(gate ? dg : du));
    }
  }
};

// Current scaling's bookkeeping done by the cast (fp8_cast_transpose_current): with `amax` set,
// every block computes the scale from it (the same fp32 expression as current_scale_kernel) and
// block (0, 0) stores the scale, its copy and its inverse, as current_scale_kernel and
// snapshot_scale_kernel would in launches of their own.
struct CurrentScale {
  const float* amax = nullptr;
  float *scale = nullptr, *used = nullptr, *used_inv = nullptr;
};

// max |dh| over SwiGLU's input gradient dh [R, 2F] as stored in T, from dy [R, F] and h without
// writing dh: each 8-vector of dy gives the gate's and the up half's 8 gradients at once (h and dy
// read once). n8 = R * F / 8 vectors (F % 8 == 0).
template <typename T>
__global__ void swiglu_grad_amax_kernel(const T* __restrict__ dy, const T* __restrict__ h, int64_t n8, int64_t F,
                                        float* amax) {
  float m = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n8; i += int64_t{gridDim.x} * blockDim.x) {
    float dg[8], du[8];
    swiglu_grads8(dy, h, F, (8 * i) / F, (8 * i) % F, dg, du);
    for (int k = 0; k < 8; ++k) m = fmaxf(m, fmaxf(fabsf(dg[k]), fabsf(du[k])));
  }
  commit_block(m, 0, amax, nullptr);
}

// The scale a cast uses: its state's, or (current scaling, cur.amax set) the one computed from the
// amax, which block (0, 0) also stores with its copy and inverse.
__device__ __forceinline__ float cast_scale(const float* scale, float fp8_max, const CurrentScale& cur) {
  const float s = cur.amax ? fp8::scale_from_amax(*cur.amax, fp8_max, 1.f) : *scale;
  if (cur.amax && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    *cur.scale = s;
    *cur.used = s;
    *cur.used_inv = 1.f / s;
  }
  return s;
}

// The codes of 8 consecutive values (lo: the first four, hi: the rest; value k at byte k % 4),
// joining max |v| into m and the values that clip into `clipped`.
__device__ __forceinline__ void codes8(const float* v, float s, float fp8_max, __nv_fp8_interpretation_t kind,
                                       float& m, unsigned& clipped, uint32_t& lo, uint32_t& hi) {
  lo = hi = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    m = fmaxf(m, fabsf(v[k]));
    clipped += fabsf(v[k] * s) > fp8_max;
    const uint32_t code = __nv_cvt_float_to_fp8(v[k] * s, __NV_SATFINITE, kind);
    if (k < 4) lo |= code << (8 * k);
    else hi |= code << (8 * (k - 4));
  }
}

// What a lane of the vector casts (fp8_tile.cuh's layout) starts from: the cast's scale and
// format, its block's corner (r, c), and its running amax and clipped count.
struct LaneCast {
  float s, fp8_max;
  __nv_fp8_interpretation_t kind;
  int64_t r, c;
  float m = 0.f;
  unsigned clipped = 0;
  __device__ LaneCast(const float* scale, bool e5m2, float max, const CurrentScale& cur)
      : s(cast_scale(scale, max, cur)),
        fp8_max(max),
        kind(e5m2 ? __NV_E5M2 : __NV_E4M3),
        r(lane_row(int64_t{blockIdx.y} * kVecTileRows)),
        c(lane_col(int64_t{blockIdx.x} * kVecTileCols)) {}
  __device__ void codes(const float* v, uint32_t& lo, uint32_t& hi) { codes8(v, s, fp8_max, kind, m, clipped, lo, hi); }
};

// The vector cast (fp8_tile.cuh's layout): each lane loads its 8x8 block (8 rows of 8 elements,
// 16 bytes of bf16 each: 128 bytes in flight a lane, all issued before any is used), writes the
// codes row-major (one 8-byte store a row) and, transposed in registers, column-major (one 8-byte
// store a column). No shared memory but the block's reduction. The codes, amax and clipped count
// are the scalar kernel's: the same expression per element, max and sum being order-free.
template <typename Load>
__global__ void __launch_bounds__(kVecThreads)
    cast_transpose_vec_kernel(Load load, int64_t R, int64_t C, const float* scale, bool e5m2, float fp8_max,
                              uint8_t* __restrict__ q, uint8_t* __restrict__ qt, float* amax,
                              unsigned long long* saturated, CurrentScale cur) {
  LaneCast L(scale, e5m2, fp8_max, cur);
  const int64_t r = L.r, c = L.c;
  if (r < R && c < C) {  // R, C multiples of 8: a lane's block is wholly inside or outside
    typename Load::Raw raw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) raw[i] = load.fetch(r + i, c);
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float v[8];
      load.values(raw[i], c, v);
      L.codes(v, lo[i], hi[i]);
      if (q) *reinterpret_cast<uint2*>(q + (r + i) * C + c) = make_uint2(lo[i], hi[i]);
    }
    if (qt) store_block_transposed(lo, hi, r, c, R, qt);
  }
  commit_block(L.m, L.clipped, amax, saturated);
}

// SwiGLU's input gradient dh [R, 2F] = [d gate | d up] cast from dy [R, F] and h [R, 2F] in one
// read of each: a lane of the grid over F columns takes its 8x8 block of dy, gate and up, and
// writes the codes of both halves (columns c and F + c, row-major and transposed). The generic
// kernel with SwigluGradLoad covers the 2F columns, so each half's tiles read dy and the gate
// again (twice the loads, from L2 at best). Rows in two passes of four: 12 loads (192 bytes) in
// flight a lane, not 24, to keep 2 blocks an SM. The values are swiglu_grads8's, rounded to T.
template <typename T>
__global__ void __launch_bounds__(kVecThreads, 2)
    swiglu_grad_cast_kernel(const T* __restrict__ dy, const T* __restrict__ h, int64_t R, int64_t F,
                            const float* scale, bool e5m2, float fp8_max, uint8_t* __restrict__ q,
                            uint8_t* __restrict__ qt, float* amax, unsigned long long* saturated, CurrentScale cur) {
  LaneCast L(scale, e5m2, fp8_max, cur);
  const int64_t r = L.r, c = L.c;
  if (r < R && c < F) {  // R, F multiples of 8: a lane's block is wholly inside or outside
    uint32_t glo[8], ghi[8], ulo[8], uhi[8];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      Raw8<T> rd[4], rg[4], ru[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = r + 4 * half + i;
        rd[i] = fetch8(dy + row * F + c);
        rg[i] = fetch8(h + row * 2 * F + c);
        ru[i] = fetch8(h + row * 2 * F + F + c);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int ri = 4 * half + i;
        float d[8], g[8], u[8], dg[8], du[8];
        unpack8(rd[i], d);
        unpack8(rg[i], g);
        unpack8(ru[i], u);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          swiglu_grads(d[k], g[k], u[k], dg[k], du[k]);
          dg[k] = to_f(from_f<T>(dg[k]));
          du[k] = to_f(from_f<T>(du[k]));
        }
        L.codes(dg, glo[ri], ghi[ri]);
        L.codes(du, ulo[ri], uhi[ri]);
        if (q) {
          uint8_t* row = q + (r + ri) * 2 * F;
          *reinterpret_cast<uint2*>(row + c) = make_uint2(glo[ri], ghi[ri]);
          *reinterpret_cast<uint2*>(row + F + c) = make_uint2(ulo[ri], uhi[ri]);
        }
      }
    }
    if (qt) {
      store_block_transposed(glo, ghi, r, c, R, qt);
      store_block_transposed(ulo, uhi, r, F + c, R, qt);
    }
  }
  commit_block(L.m, L.clipped, amax, saturated);
}

// The same through a 64x64 shared-memory tile (MT_FP8_CAST_KERNEL=tile, fp8_cast_kernel.h): each
// thread loads 8 elements of a row twice (32 bytes in flight), writes their codes row-major and
// into the tile, and after the block's barrier 8 rows of a tile column (a row of qt).
template <typename Load>
__global__ void __launch_bounds__(kVecThreads, 8)  // 32 registers, 8 blocks an SM: as it was
    cast_transpose_smem_kernel(Load load, int64_t R, int64_t C, const float* scale, bool e5m2, float fp8_max,
                               uint8_t* __restrict__ q, uint8_t* __restrict__ qt, float* amax,
                               unsigned long long* saturated, CurrentScale cur) {
  __shared__ __align__(8) uint8_t tile[kSmemTile][kSmemPitch];
  const float s = cast_scale(scale, fp8_max, cur);
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int64_t r0 = int64_t{blockIdx.y} * kSmemTile, c0 = int64_t{blockIdx.x} * kSmemTile;
  const int tc = (threadIdx.x % 8) * 8;  // this thread's 8 columns in the tile
  float m = 0.f;
  unsigned clipped = 0;
  constexpr int kPasses = kSmemTile / (kVecThreads / 8);
  typename Load::Raw raw[kPasses];
  bool inside[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = r0 + threadIdx.x / 8 + p * (kVecThreads / 8), c = c0 + tc;
    inside[p] = r < R && c < C;  // C % 8 == 0: a vector is wholly inside or outside
    if (inside[p]) raw[p] = load.fetch(r, c);
  }
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    if (!inside[p]) continue;
    const int i = threadIdx.x / 8 + p * (kVecThreads / 8);
    const int64_t r = r0 + i, c = c0 + tc;
    float v[8];
    load.values(raw[p], c, v);
    uint32_t lo, hi;
    codes8(v, s, fp8_max, kind, m, clipped, lo, hi);
    if (q) *reinterpret_cast<uint2*>(q + r * C + c) = make_uint2(lo, hi);
    *reinterpret_cast<uint32_t*>(&tile[i][tc]) = lo;
    *reinterpret_cast<uint32_t*>(&tile[i][tc + 4]) = hi;
  }
  commit_block(m, clipped, amax, saturated);  // its barrier also completes the tile
  if (qt) store_smem_tile_transposed(tile, r0, c0, R, C, qt);
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

using cuda::compute_stream;

namespace {

// Blocks of kVecThreads that fit the device at once (8 an SM): a grid-stride pass sized to one wave.
unsigned resident_blocks() {
  static const unsigned n = [] {
    int dev = 0, sms = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return static_cast<unsigned>(sms * (2048 / cuda::kVecThreads));
  }();
  return n;
}

}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax) {
  float* a = cuda_data<float>(amax, DType::F32, 1, "fp8_amax (amax)");
  MT_CUDA_CHECK(cudaMemsetAsync(a, 0, sizeof(float), compute_stream()));
  const int64_t n = x.numel();
  if (n == 0) return;
  const bool vec = n % 8 == 0 && reinterpret_cast<uintptr_t>(x.raw()) % 16 == 0;
  with_float_type(x, [&](auto* p) {
    if (vec)
      cuda::amax_vec_kernel<<<cuda::grid_for(n / 8, cuda::kVecThreads * cuda::kAmaxUnroll, resident_blocks()),
                              cuda::kVecThreads, 0, compute_stream()>>>(p, n / 8, a);
    else
      cuda::amax_kernel<<<cuda::grid_for(n, cuda::kThreads, 1024), cuda::kThreads, 0, compute_stream()>>>(p, n, a);
  }, "fp8_amax");
  MT_CUDA_LAUNCH_CHECK();
}

void fp8_delayed_update(Tensor& history, Tensor& scale, const Tensor& amax, float fp8_max, int margin, bool use_max) {
  check_cuda_tensor(history, DType::F32, "fp8_delayed_update (history)");
  MT_CHECK(history.numel() >= 1, "fp8_delayed_update: an empty history");
  cuda::delayed_update_kernel<<<1, 1, 0, compute_stream()>>>(
      history.data<float>(), history.numel(), cuda_data<float>(scale, DType::F32, 1, "fp8_delayed_update (scale)"),
      cuda_data<float>(amax, DType::F32, 1, "fp8_delayed_update (amax)"), fp8::scaled_max(fp8_max, margin), use_max);
  MT_CUDA_LAUNCH_CHECK();
}

void fp8_current_scale(const Tensor& amax, Tensor& scale, float fp8_max) {
  cuda::current_scale_kernel<<<1, 1, 0, compute_stream()>>>(
      cuda_data<float>(amax, DType::F32, 1, "fp8_current_scale (amax)"),
      cuda_data<float>(scale, DType::F32, 1, "fp8_current_scale (scale)"), fp8_max);
  MT_CUDA_LAUNCH_CHECK();
}

void fp8_snapshot_scale(const Tensor& scale, Tensor& used, Tensor& used_inv) {
  cuda::snapshot_scale_kernel<<<1, 1, 0, compute_stream()>>>(
      cuda_data<float>(scale, DType::F32, 1, "fp8_snapshot_scale (scale)"),
      cuda_data<float>(used, DType::F32, 1, "fp8_snapshot_scale (used)"),
      cuda_data<float>(used_inv, DType::F32, 1, "fp8_snapshot_scale (used_inv)"));
  MT_CUDA_LAUNCH_CHECK();
}

Tensor fp8_fake_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Tensor& saturated) {
  const float* s = cuda_data<float>(scale, DType::F32, 1, "fp8_fake_quantize (scale)");
  auto* sat = reinterpret_cast<unsigned long long*>(
      cuda_data<int64_t>(saturated, DType::I64, 1, "fp8_fake_quantize (saturated)"));
  Tensor y = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  const int64_t n = x.numel();
  if (n == 0) return y;
  with_float_type(x, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    cuda::fake_quantize_kernel<<<cuda::grid_for(n, cuda::kThreads), cuda::kThreads, 0, compute_stream()>>>(
        p, y.data<T>(), n, s, format == Fp8Format::E5M2, fp8_max(format), sat);
  }, "fp8_fake_quantize");
  MT_CUDA_LAUNCH_CHECK();
  return y;
}

Tensor fp8_fake_quantize_blocks(const Tensor& x, Fp8Format format, int64_t tile_r, int64_t tile_c, Tensor& scales) {
  MT_CHECK(x.ndim() == 2 && tile_r > 0 && tile_c > 0, "fp8_fake_quantize_blocks: [R, C] in positive tiles, got {}",
           x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1), tr = cuda::ceil_div(R, tile_r), tc = cuda::ceil_div(C, tile_c);
  float* sc = cuda_data<float>(scales, DType::F32, tr * tc, "fp8_fake_quantize_blocks (scales)");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  if (tr * tc == 0) return y;
  with_float_type(x, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    cuda::fake_quantize_blocks_kernel<<<static_cast<unsigned>(tr * tc), cuda::kThreads, 0, compute_stream()>>>(
        p, y.data<T>(), R, C, tile_r, tile_c, tc, format == Fp8Format::E5M2, fp8_max(format), sc);
  }, "fp8_fake_quantize_blocks");
  MT_CUDA_LAUNCH_CHECK();
  return y;
}

namespace {

// The outputs of a cast [R, C] (fp8_cast_transpose's contract), checked, as raw pointers.
struct CastOut {
  int64_t R, C;
  uint8_t *q, *qt;
  const float* scale;
  float* amax;
  unsigned long long* saturated;
  bool e5m2;
  float max;
  const char* what;
  // am: where the cast max-reduces |x| (null: nowhere, the amax being known already).
  CastOut(int64_t r, int64_t c, const Tensor& sc, Fp8Format f, Tensor& q_, Tensor* qt_, Tensor* am, Tensor& sat,
          const char* w)
      : R(r), C(c), e5m2(f == Fp8Format::E5M2), max(fp8_max(f)), what(w) {
    q = q_.defined() ? cuda_data<uint8_t>(q_, DType::U8, R * C, w) : nullptr;
    MT_CHECK(q || qt_, "{}: neither q nor qt asked for", w);
    qt = qt_ ? cuda_data<uint8_t>(*qt_, DType::U8, R * C, w) : nullptr;
    scale = cuda_data<float>(sc, DType::F32, 1, w);
    amax = am ? cuda_data<float>(*am, DType::F32, 1, w) : nullptr;
    saturated = reinterpret_cast<unsigned long long*>(cuda_data<int64_t>(sat, DType::I64, 1, w));
  }
  // Whether the vector kernel serves it, its inputs `in` 16-byte aligned (codes are fresh
  // allocations: 8-byte aligned unless views).
  bool vec(std::initializer_list<const void*> in) const {
    bool ok = R % 8 == 0 && C % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0 &&
              reinterpret_cast<uintptr_t>(qt) % 8 == 0 && cuda::ceil_div(R, cuda::kSmemTile) < 65536;
    for (const void* p : in) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
    return ok;
  }
  template <typename Load>
  void launch_vec(const Load& load, const cuda::CurrentScale& cur = {}) const {
    if (fp8_cast_smem_tiles()) {
      const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kSmemTile)),
                      static_cast<unsigned>(cuda::ceil_div(R, cuda::kSmemTile)));
      cuda::cast_transpose_smem_kernel<<<grid, cuda::kVecThreads, 0, compute_stream()>>>(load, R, C, scale, e5m2, max,
                                                                                         q, qt, amax, saturated, cur);
    } else {
      const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kVecTileCols)),
                      static_cast<unsigned>(cuda::ceil_div(R, cuda::kVecTileRows)));
      cuda::cast_transpose_vec_kernel<<<grid, cuda::kVecThreads, 0, compute_stream()>>>(load, R, C, scale, e5m2, max,
                                                                                        q, qt, amax, saturated, cur);
    }
    MT_CUDA_LAUNCH_CHECK();
  }
};

}  // namespace

void fp8_cast_transpose(const Tensor& x, const Tensor& scale, Fp8Format format, Tensor& q, Tensor* qt, Tensor& amax,
                        Tensor& saturated) {
  MT_CHECK(x.ndim() == 2, "fp8_cast_transpose: [R, C], got {}", x.shape_str());
  const CastOut o(x.dim(0), x.dim(1), scale, format, q, qt, &amax, saturated, "fp8_cast_transpose");
  if (o.R * o.C == 0) return;
  const bool vec = o.vec({x.raw()});
  MT_CHECK(vec || cuda::ceil_div(o.R, cuda::kTileDim) < 65536, "fp8_cast_transpose: {} rows exceed the grid", o.R);
  with_float_type(x, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    if (vec) {
      o.launch_vec(cuda::PlainLoad<T>{p, o.C});
      return;
    }
    const dim3 grid(static_cast<unsigned>(cuda::ceil_div(o.C, cuda::kTileDim)),
                    static_cast<unsigned>(cuda::ceil_div(o.R, cuda::kTileDim)));
    cuda::cast_transpose_kernel<<<grid, dim3(cuda::kTileDim, cuda::kTileRows), 0, compute_stream()>>>(
        p, o.R, o.C, o.scale, o.e5m2, o.max, o.q, o.qt, o.amax, o.saturated);
    MT_CUDA_LAUNCH_CHECK();
  }, "fp8_cast_transpose");
}

void fp8_cast_transpose_current(const Tensor& x, const Tensor& amax, Fp8Format format, Tensor& scale, Tensor& used,
                                Tensor& used_inv, Tensor& q, Tensor* qt, Tensor& saturated) {
  MT_CHECK(x.ndim() == 2, "fp8_cast_transpose_current: [R, C], got {}", x.shape_str());
  const CastOut o(x.dim(0), x.dim(1), scale, format, q, qt, nullptr, saturated, "fp8_cast_transpose_current");
  cuda::CurrentScale cur;
  cur.amax = cuda_data<float>(amax, DType::F32, 1, "fp8_cast_transpose_current (amax)");
  cur.scale = cuda_data<float>(scale, DType::F32, 1, "fp8_cast_transpose_current (scale)");
  cur.used = cuda_data<float>(used, DType::F32, 1, "fp8_cast_transpose_current (used)");
  cur.used_inv = cuda_data<float>(used_inv, DType::F32, 1, "fp8_cast_transpose_current (used_inv)");
  if (o.R * o.C > 0 && o.vec({x.raw()})) {
    with_float_type(x, [&](auto* p) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
      o.launch_vec(cuda::PlainLoad<T>{p, o.C}, cur);
    }, "fp8_cast_transpose_current");
    return;
  }
  // Shapes the vector kernel does not serve (and empty ones): the three ops, the same bits.
  fp8_current_scale(amax, scale, fp8_max(format));
  Tensor ignored = Tensor::zeros({1}, DType::F32, Device::CUDA);
  fp8_cast_transpose(x, scale, format, q, qt, ignored, saturated);
  fp8_snapshot_scale(scale, used, used_inv);
}

void swiglu_backward_amax(const Tensor& dy, const Tensor& h, Tensor& amax) {
  MT_CHECK(h.ndim() == 2 && h.dim(1) % 2 == 0 && dy.numel() == h.numel() / 2,
           "swiglu_backward_amax: dy [R, F] and h [R, 2F], got {} and {}", dy.shape_str(), h.shape_str());
  const int64_t F = h.dim(1) / 2, n = dy.numel();
  const bool vec = h.dtype() == DType::BF16 && dy.dtype() == DType::BF16 && F % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(h.raw()) % 16 == 0 && reinterpret_cast<uintptr_t>(dy.raw()) % 16 == 0;
  if (!vec) {  // the op and its amax (the model's shapes take the kernel)
    swiglu_backward(dy, h, &amax);
    return;
  }
  float* a = cuda_data<float>(amax, DType::F32, 1, "swiglu_backward_amax (amax)");
  MT_CUDA_CHECK(cudaMemsetAsync(a, 0, sizeof(float), compute_stream()));
  if (n == 0) return;
  cuda::swiglu_grad_amax_kernel<<<cuda::grid_for(n / 8, cuda::kVecThreads, 2048), cuda::kVecThreads, 0,
                                  compute_stream()>>>(
      dy.data<cuda::bf16>(), h.data<cuda::bf16>(), n / 8, F, a);
  MT_CUDA_LAUNCH_CHECK();
}

// The fused casts of SwiGLU's output and of its input gradient: one kernel where the vector
// kernel serves the shape (the model's case), else the unfused pair (the same bits, by the
// definition of the op).
void swiglu_forward_fp8(const Tensor& h, const Tensor& scale, Fp8Format format, Tensor& q, Tensor* qt, Tensor& amax,
                        Tensor& saturated) {
  MT_CHECK(h.ndim() == 2 && h.dim(1) % 2 == 0, "swiglu_forward_fp8: h [R, 2F], got {}", h.shape_str());
  const int64_t F = h.dim(1) / 2;
  const CastOut o(h.dim(0), F, scale, format, q, qt, &amax, saturated, "swiglu_forward_fp8");
  if (o.R * o.C == 0) return;
  if (h.dtype() == DType::BF16 && o.vec({h.raw()})) {
    o.launch_vec(cuda::SwigluLoad<cuda::bf16>{h.data<cuda::bf16>(), F});
    return;
  }
  fp8_cast_transpose(swiglu_forward(h, nullptr), scale, format, q, qt, amax, saturated);
}

void swiglu_backward_fp8(const Tensor& dy, const Tensor& h, const Tensor& scale, Fp8Format format, Tensor& q,
                         Tensor* qt, Tensor& amax, Tensor& saturated) {
  MT_CHECK(h.ndim() == 2 && h.dim(1) % 2 == 0 && dy.numel() == h.numel() / 2,
           "swiglu_backward_fp8: dy [R, F] and h [R, 2F], got {} and {}", dy.shape_str(), h.shape_str());
  const int64_t F = h.dim(1) / 2;
  const CastOut o(h.dim(0), 2 * F, scale, format, q, qt, &amax, saturated, "swiglu_backward_fp8");
  if (o.R * o.C == 0) return;
  if (h.dtype() == DType::BF16 && dy.dtype() == DType::BF16 && F % 8 == 0 && o.vec({h.raw(), dy.raw()})) {
    if (fp8_cast_smem_tiles()) {
      o.launch_vec(cuda::SwigluGradLoad<cuda::bf16>{dy.data<cuda::bf16>(), h.data<cuda::bf16>(), F});
      return;
    }
    const dim3 grid(static_cast<unsigned>(cuda::ceil_div(F, cuda::kVecTileCols)),
                    static_cast<unsigned>(cuda::ceil_div(o.R, cuda::kVecTileRows)));
    cuda::swiglu_grad_cast_kernel<<<grid, cuda::kVecThreads, 0, compute_stream()>>>(
        dy.data<cuda::bf16>(), h.data<cuda::bf16>(), o.R, F, o.scale, o.e5m2, o.max, o.q, o.qt, o.amax, o.saturated,
        cuda::CurrentScale{});
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  fp8_cast_transpose(swiglu_backward(dy, h, nullptr), scale, format, q, qt, amax, saturated);
}

}  // namespace mt::ops::gpu
