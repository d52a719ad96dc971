// Blockwise FP8 casts of ops.def on the GPU (the CPU reference: kernels/cpu/fp8_blocks.cpp, byte
// for byte): x cast to the codes and scales cuBLASLt's block-scaled GEMMs read, row-major and
// transposed from one read of x. One block of 256 threads per 128x128 tile of x; each thread
// holds an 8x8 piece (8 rows of 8 consecutive columns, 16-byte loads), so that
//   * a 1x128 row tile's amax is a max over the 16 threads of its row (shuffles),
//   * a 128x1 column tile's amax (the transposed codes' tiles) a max over the 16 threads of its
//     columns (a shuffle, then the 8 warps through shared memory),
//   * a 128x128 tile's amax a max over the block.
// The row-major codes go out as 8-byte stores; the transposed ones through a shared-memory tile
// whose 8-byte chunks are XOR-swizzled (chunk rg of column c at rg ^ (c / 8)) so that the 16 threads
// of a half-warp write 16 different banks pairs, then out as 16-byte stores along qt's rows.
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/fp8_blocks.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kTile = 128, kThreads = 256, kWarps = kThreads / 32;

struct CastArgs {
  int64_t R = 0, C = 0;
  bool e5m2 = false;
  float fp8_max = 0;
  uint8_t* q = nullptr;  // [R, C], scales q_si
  float* q_si = nullptr;
  uint8_t* qt = nullptr;  // [C, R], scales qt_si
  float* qt_si = nullptr;
};

// Codes of v[k] * s[k], k < 8, byte k = element k.
__device__ __forceinline__ uint2 codes8(const float* v, const float* s, __nv_fp8_interpretation_t kind) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k)
    w[k / 4] |= uint32_t{__nv_cvt_float_to_fp8(v[k] * s[k], __NV_SATFINITE, kind)} << (8 * (k % 4));
  return make_uint2(w[0], w[1]);
}

// kBlocks: 128x128 tiles (one scale for the tile); else 1x128 tiles for q and 128x1 for qt.
template <typename T, bool kBlocks>
__global__ void __launch_bounds__(kThreads) block_cast_kernel(const T* __restrict__ x, CastArgs a) {
  __shared__ __align__(16) uint8_t tile[kTile][kTile];  // tile[c][.]: column c's codes, swizzled chunks
  __shared__ float part[kWarps][kTile];                  // per-warp maxima
  const __nv_fp8_interpretation_t kind = a.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const int cg = threadIdx.x % 16, rg = threadIdx.x / 16, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = int64_t{blockIdx.y} * kTile, c0 = int64_t{blockIdx.x} * kTile;
  const int64_t c = c0 + cg * 8, rb = r0 + rg * 8;  // this thread's first column and row
  const bool cols_in = c < a.C;                        // C % 16 == 0: 8 columns wholly in or out
  float v[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (cols_in && rb + i < a.R) {
      load_group<T, 8>(x + (rb + i) * a.C + c, 8, true, v[i]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[i][k] = 0.f;  // outside x: no effect on any amax
    }
  }

  float tile_s = 1.f;
  if constexpr (kBlocks) {
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[i][k]));  // fmaxf drops NaN, as the CPU's fmax
    m = warp_max(m);
    if (lane == 0) part[warp][0] = m;
    __syncthreads();
    m = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, part[w][0]);
    tile_s = fp8::block_scale(m, a.fp8_max);
    if (threadIdx.x == 0) {
      if (a.q_si) a.q_si[fp8::tile_scale_index(Fp8Tiles::Blocks128x128, a.R, a.C, r0, c0)] = 1.f / tile_s;
      if (a.qt_si) a.qt_si[fp8::tile_scale_index(Fp8Tiles::Blocks128x128, a.C, a.R, c0, r0)] = 1.f / tile_s;
    }
  }

  if (a.q) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float s = tile_s;
      if constexpr (!kBlocks) {
        float m = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[i][k]));
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // the row's 16 threads
        s = fp8::block_scale(m, a.fp8_max);
      }
      const int64_t r = rb + i;
      if (!cols_in || r >= a.R) continue;
      const float sk[8] = {s, s, s, s, s, s, s, s};
      *reinterpret_cast<uint2*>(a.q + r * a.C + c) = codes8(v[i], sk, kind);
      if (!kBlocks && cg == 0) a.q_si[fp8::tile_scale_index(Fp8Tiles::Rows1x128, a.R, a.C, r, c0)] = 1.f / s;
    }
  }
  if (!a.qt) return;

  float sc[8];  // the scales of this thread's 8 columns' 128x1 tiles
  if constexpr (kBlocks) {
#pragma unroll
    for (int k = 0; k < 8; ++k) sc[k] = tile_s;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float m = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i][k]));
      sc[k] = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));  // the warp's two row groups
    }
    if (lane < 16)
#pragma unroll
      for (int k = 0; k < 8; ++k) part[warp][cg * 8 + k] = sc[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float m = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, part[w][cg * 8 + k]);
      sc[k] = fp8::block_scale(m, a.fp8_max);
      if (rg == 0 && cols_in)
        a.qt_si[fp8::tile_scale_index(Fp8Tiles::Rows1x128, a.C, a.R, c + k, r0)] = 1.f / sc[k];
    }
  }
  // Column cg * 8 + k's codes of this thread's 8 rows: one 8-byte chunk of the transposed tile.
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float col[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) col[i] = v[i][k];
    const float sk[8] = {sc[k], sc[k], sc[k], sc[k], sc[k], sc[k], sc[k], sc[k]};
    *reinterpret_cast<uint2*>(&tile[cg * 8 + k][8 * (rg ^ cg)]) = codes8(col, sk, kind);
  }
  __syncthreads();
  // qt's rows: 128 columns of x, each 128 codes (8 pieces of 16 bytes, R % 16 == 0).
  for (int p = threadIdx.x; p < kTile * 8; p += kThreads) {
    const int cc = p / 8, j = p % 8, sw = cc / 8;
    const int64_t col = c0 + cc, r = r0 + 16 * j;
    if (col >= a.C || r >= a.R) continue;
    const uint2 lo = *reinterpret_cast<const uint2*>(&tile[cc][8 * ((2 * j) ^ sw)]);
    const uint2 hi = *reinterpret_cast<const uint2*>(&tile[cc][8 * ((2 * j + 1) ^ sw)]);
    *reinterpret_cast<uint4*>(a.qt + col * a.R + r) = make_uint4(lo.x, lo.y, hi.x, hi.y);
  }
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

using cuda::compute_stream;

namespace {

void block_cast(const Tensor& x, Fp8Format format, Fp8Tiles tiles, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                Tensor* qt_scale_inv, const char* what) {
  MT_CHECK(x.ndim() == 2, "{}: [R, C], got {}", what, x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1);
  MT_CHECK(R % 16 == 0 && C % 16 == 0 && cuda::aligned16(x.raw()),
           "{}: the GPU casts [R, C] with R and C multiples of 16 (16-byte aligned), got {}", what, x.shape_str());
  cuda::CastArgs a;
  a.R = R;
  a.C = C;
  a.e5m2 = format == Fp8Format::E5M2;
  a.fp8_max = fp8_max(format);
  if (q.defined()) {
    a.q = cuda_data<uint8_t>(q, DType::U8, R * C, what);
    a.q_si = cuda_data<float>(q_scale_inv, DType::F32, fp8::tile_scales(tiles, R, C), what);
  }
  if (qt) {
    MT_CHECK(qt_scale_inv, "{}: qt without its scales", what);
    a.qt = cuda_data<uint8_t>(*qt, DType::U8, R * C, what);
    a.qt_si = cuda_data<float>(*qt_scale_inv, DType::F32, fp8::tile_scales(tiles, C, R), what);
  }
  MT_CHECK(a.q || a.qt, "{}: neither q nor qt asked for", what);
  MT_CHECK(reinterpret_cast<uintptr_t>(a.q) % 8 == 0 && cuda::aligned16(a.qt), "{}: codes not 16-byte aligned", what);
  MT_CHECK(cuda::ceil_div(R, cuda::kTile) < 65536, "{}: {} rows exceed the grid", what, R);
  if (tiles == Fp8Tiles::Blocks128x128) {  // zero the padding of the scale rows
    if (a.q_si) MT_CUDA_CHECK(cudaMemsetAsync(a.q_si, 0, q_scale_inv.nbytes(), compute_stream()));
    if (a.qt_si) MT_CUDA_CHECK(cudaMemsetAsync(a.qt_si, 0, qt_scale_inv->nbytes(), compute_stream()));
  }
  if (R * C == 0) return;
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kTile)), static_cast<unsigned>(cuda::ceil_div(R, cuda::kTile)));
  with_float_type(x, [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    if (tiles == Fp8Tiles::Blocks128x128)
      cuda::block_cast_kernel<T, true><<<grid, cuda::kThreads, 0, compute_stream()>>>(p, a);
    else
      cuda::block_cast_kernel<T, false><<<grid, cuda::kThreads, 0, compute_stream()>>>(p, a);
  }, what);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void fp8_block_cast_rows(const Tensor& x, Fp8Format format, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                         Tensor* qt_scale_inv) {
  block_cast(x, format, Fp8Tiles::Rows1x128, q, q_scale_inv, qt, qt_scale_inv, "fp8_block_cast_rows");
}

void fp8_block_cast_tiles(const Tensor& x, Fp8Format format, Tensor& q, Tensor& q_scale_inv, Tensor* qt,
                          Tensor* qt_scale_inv) {
  block_cast(x, format, Fp8Tiles::Blocks128x128, q, q_scale_inv, qt, qt_scale_inv, "fp8_block_cast_tiles");
}

}  // namespace mt::ops::gpu
