// FP8 codes that arrive ready-made (--fp8-param-gather's all-gathered weights) on the GPU: read
// back with their scale_inv (for the emulated GEMMs) and transposed (the data gradient's K-major
// weight). The CPU reference is kernels/cpu/fp8_codes.cpp.
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_cast_kernel.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/tensor_args.h"
#include "kernels/fp8_codes.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32, kTileRows = 8;

// The decode fp8.cu's fake quantization reads its rounded value back with (through half), so
// the two agree bit for bit.
template <typename T>
__global__ void dequantize_kernel(const uint8_t* __restrict__ q, T* __restrict__ y, int64_t n,
                                  const float* scale_inv, bool e5m2) {
  const __nv_fp8_interpretation_t k = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const float inv = *scale_inv;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    y[i] = from_f<T>(__half2float(__half(__nv_cvt_fp8_to_halfraw(q[i], k))) * inv);
}

// A 32x32 tile through shared memory (one padding column against bank conflicts).
__global__ void transpose_codes_kernel(const uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int64_t R, int64_t C) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t c0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[i][threadIdx.x] = q[r * C + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < R && c < C) qt[c * R + r] = tile[threadIdx.x][i];
  }
}

// The same in fp8_tile.cuh's layout (R, C multiples of 8, pointers 8-byte aligned: the weights'
// codes each backward transposes under MT_FP8_WT_FROM_CODES, model/fp8.h): each lane loads its
// 8x8 block as 8 row pieces of 8 bytes (64 bytes in flight), transposes it in registers and writes
// 8 column pieces; one byte a thread per access leaves the scalar kernel well short of memory
// bandwidth.
__global__ void __launch_bounds__(kVecThreads)
    transpose_codes_vec_kernel(const uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int64_t R, int64_t C) {
  const int64_t r = lane_row(int64_t{blockIdx.y} * kVecTileRows), c = lane_col(int64_t{blockIdx.x} * kVecTileCols);
  if (r >= R || c >= C) return;  // R, C multiples of 8: a lane's block is wholly inside or outside
  uint32_t lo[8], hi[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint2 v = *reinterpret_cast<const uint2*>(q + (r + i) * C + c);
    lo[i] = v.x;
    hi[i] = v.y;
  }
  store_block_transposed(lo, hi, r, c, R, qt);
}

// The same through a 64x64 shared-memory tile (MT_FP8_CAST_KERNEL=tile, fp8_cast_kernel.h): each
// thread loads 8 codes of a row twice, then stores 8 codes of a column twice (a row of qt).
__global__ void __launch_bounds__(kVecThreads)
    transpose_codes_smem_kernel(const uint8_t* __restrict__ q, uint8_t* __restrict__ qt, int64_t R, int64_t C) {
  __shared__ __align__(8) uint8_t tile[kSmemTile][kSmemPitch];
  const int64_t r0 = int64_t{blockIdx.y} * kSmemTile, c0 = int64_t{blockIdx.x} * kSmemTile;
  const int tc = (threadIdx.x % 8) * 8;
  for (int i = threadIdx.x / 8; i < kSmemTile; i += kVecThreads / 8) {
    const int64_t r = r0 + i, c = c0 + tc;
    if (r >= R || c >= C) continue;  // C % 8 == 0: a vector is wholly inside or outside
    const uint2 v = *reinterpret_cast<const uint2*>(q + r * C + c);
    *reinterpret_cast<uint32_t*>(&tile[i][tc]) = v.x;
    *reinterpret_cast<uint32_t*>(&tile[i][tc + 4]) = v.y;
  }
  __syncthreads();
  store_smem_tile_transposed(tile, r0, c0, R, C, qt);
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {

using cuda::compute_stream;

namespace {
std::atomic<bool> smem_tiles{[] {
  const char* v = std::getenv("MT_FP8_CAST_KERNEL");
  return v && std::strcmp(v, "tile") == 0;
}()};
}  // namespace

bool fp8_cast_smem_tiles() { return smem_tiles.load(std::memory_order_relaxed); }
void set_fp8_cast_smem_tiles(bool on) { smem_tiles.store(on, std::memory_order_relaxed); }

Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype) {
  check_cuda_tensor(q, DType::U8, "fp8_dequantize (q)");
  const float* inv = cuda_data<float>(scale_inv, DType::F32, 1, "fp8_dequantize (scale_inv)");
  Tensor y = Tensor::empty(q.shape(), dtype, Device::CUDA);
  const int64_t n = q.numel();
  if (n == 0) return y;
  with_float_type(y, [&](auto* p) {
    cuda::dequantize_kernel<<<cuda::grid_for(n, cuda::kThreads), cuda::kThreads, 0, compute_stream()>>>(
        q.data<uint8_t>(), p, n, inv, format == Fp8Format::E5M2);
  }, "fp8_dequantize");
  MT_CUDA_LAUNCH_CHECK();
  return y;
}

void fp8_transpose_codes(const Tensor& q, Tensor& qt) {
  check_cuda_tensor(q, DType::U8, "fp8_transpose_codes (q)");
  MT_CHECK(q.ndim() == 2, "fp8_transpose_codes: [R, C] codes, got {}", q.shape_str());
  const int64_t R = q.dim(0), C = q.dim(1);
  uint8_t* out = cuda_data<uint8_t>(qt, DType::U8, R * C, "fp8_transpose_codes (qt)");
  if (R * C == 0) return;
  const auto* in = q.data<uint8_t>();
  if (R % 8 == 0 && C % 8 == 0 && reinterpret_cast<uintptr_t>(in) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0 &&
      cuda::ceil_div(R, cuda::kSmemTile) < 65536) {
    if (fp8_cast_smem_tiles()) {
      const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kSmemTile)),
                      static_cast<unsigned>(cuda::ceil_div(R, cuda::kSmemTile)));
      cuda::transpose_codes_smem_kernel<<<grid, cuda::kVecThreads, 0, compute_stream()>>>(in, out, R, C);
    } else {
      const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kVecTileCols)),
                      static_cast<unsigned>(cuda::ceil_div(R, cuda::kVecTileRows)));
      cuda::transpose_codes_vec_kernel<<<grid, cuda::kVecThreads, 0, compute_stream()>>>(in, out, R, C);
    }
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  MT_CHECK(cuda::ceil_div(R, cuda::kTile) < 65536, "fp8_transpose_codes: {} rows exceed the grid", R);
  const dim3 grid(static_cast<unsigned>(cuda::ceil_div(C, cuda::kTile)), static_cast<unsigned>(cuda::ceil_div(R, cuda::kTile)));
  cuda::transpose_codes_kernel<<<grid, dim3(cuda::kTile, cuda::kTileRows), 0, compute_stream()>>>(q.data<uint8_t>(), out,
                                                                                                  R, C);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::ops::gpu
