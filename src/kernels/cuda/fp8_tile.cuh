#pragma once
// The lane layout that fp8.cu's vector cast and fp8_codes.cu's vector transpose share, and the
// transposed write-out of a lane's codes: one code for the two transposes.
//
// Each lane owns an 8x8 block of codes (rows r..r+7, columns c..c+7), as two 32-bit words per row
// (columns c..c+3 and c+4..c+7). It transposes the block in registers (byte permutes) and writes
// each of its 8 columns as 8 bytes of a row of qt [C, R]: no shared memory, no bank conflicts, no
// __syncthreads. Lanes are laid out so that every global access covers whole 32-byte sectors:
// lane % 4 picks the row block (4 x 8 = 32 rows a warp), lane / 4 the column block (8 x 8 = 64
// columns), so a row-major access of row i is 8 lanes x 8 codes (or 16 bytes of bf16) side by
// side, and a transposed store is 4 lanes x 8 rows = 32 contiguous bytes of a row of qt. A block's
// 8 warps stack along the rows: a 256 x 64 tile.
//
// The 64x64 shared-memory tile the lane blocks replaced is kept (store_smem_tile_transposed,
// selected by MT_FP8_CAST_KERNEL=tile: fp8_cast_kernel.h) until the two are measured on a GPU.
#include <cstdint>

namespace mt::cuda {

constexpr int kVecThreads = 256, kVecTileRows = 256, kVecTileCols = 64;

// Where lane `threadIdx.x` of a (kVecTileRows x kVecTileCols) tile at (r0, c0) starts its block.
__device__ __forceinline__ int64_t lane_row(int64_t r0) {
  return r0 + (threadIdx.x / 32) * 32 + (threadIdx.x % 4) * 8;
}
__device__ __forceinline__ int64_t lane_col(int64_t c0) { return c0 + ((threadIdx.x % 32) / 4) * 8; }

// t[j] = byte j of a0, a1, a2, a3 (a 4x4 byte transpose; a_i are rows, t_j columns).
__device__ __forceinline__ void transpose4x4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t* t) {
  const uint32_t b0 = __byte_perm(a0, a1, 0x5140), b1 = __byte_perm(a0, a1, 0x7362);  // (a0.0 a1.0 a0.1 a1.1)...
  const uint32_t b2 = __byte_perm(a2, a3, 0x5140), b3 = __byte_perm(a2, a3, 0x7362);
  t[0] = __byte_perm(b0, b2, 0x5410);
  t[1] = __byte_perm(b0, b2, 0x7632);
  t[2] = __byte_perm(b1, b3, 0x5410);
  t[3] = __byte_perm(b1, b3, 0x7632);
}

// qt [C, R] gets the lane's block at (r, c) transposed: qt row c + j, bytes r..r+7 (R % 8 == 0,
// r % 8 == 0, qt 8-byte aligned: one 8-byte store per column).
__device__ __forceinline__ void store_block_transposed(const uint32_t* lo, const uint32_t* hi, int64_t r, int64_t c,
                                                       int64_t R, uint8_t* __restrict__ qt) {
  uint32_t top[4], bottom[4];
  transpose4x4(lo[0], lo[1], lo[2], lo[3], top);
  transpose4x4(lo[4], lo[5], lo[6], lo[7], bottom);
#pragma unroll
  for (int j = 0; j < 4; ++j) *reinterpret_cast<uint2*>(qt + (c + j) * R + r) = make_uint2(top[j], bottom[j]);
  transpose4x4(hi[0], hi[1], hi[2], hi[3], top);
  transpose4x4(hi[4], hi[5], hi[6], hi[7], bottom);
#pragma unroll
  for (int j = 0; j < 4; ++j) *reinterpret_cast<uint2*>(qt + (c + 4 + j) * R + r) = make_uint2(top[j], bottom[j]);
}

// ---- The shared-memory tile: 64x64 codes of 256 threads, each writing 8 codes of a row into
// the tile, then 8 rows of a column out of it.
constexpr int kSmemTile = 64, kSmemPitch = kSmemTile + 4;  // pitch: 17 words, fewer conflicts

// qt [C, R] gets the tile at (r0, c0) of codes [R, C] (R, C multiples of 8, qt 8-byte aligned):
// tile column cc is a row of qt; each thread writes 8 consecutive rows of x there, one 8-byte
// store. Call after a __syncthreads that completes the tile.
__device__ __forceinline__ void store_smem_tile_transposed(const uint8_t (*tile)[kSmemPitch], int64_t r0, int64_t c0,
                                                           int64_t R, int64_t C, uint8_t* __restrict__ qt) {
  for (int j = threadIdx.x; j < kSmemTile * 8; j += kVecThreads) {
    const int cc = j / 8, rv = (j % 8) * 8;
    const int64_t c = c0 + cc, r = r0 + rv;
    if (c >= C || r >= R) continue;  // R % 8 == 0
    uint32_t lo = 0, hi = 0;
    for (int k = 0; k < 4; ++k) {
      lo |= uint32_t{tile[rv + k][cc]} << (8 * k);
      hi |= uint32_t{tile[rv + 4 + k][cc]} << (8 * k);
    }
    *reinterpret_cast<uint2*>(qt + c * R + r) = make_uint2(lo, hi);
  }
}

}  // namespace mt::cuda
