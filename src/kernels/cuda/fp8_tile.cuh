#pragma once
// The 64x64 tile of FP8 codes that fp8.cu's vector cast and fp8_codes.cu's vector transpose stage
// in shared memory, and its write-out transposed: shared so the two transposes are one code.
#include <cstdint>

namespace mt::cuda {

constexpr int kVecTile = 64, kVecThreads = 256, kVecPitch = kVecTile + 4;  // pitch: 17 words, fewer conflicts

// qt [C, R] gets the tile at (r0, c0) of codes [R, C] (R, C multiples of 8, qt 8-byte aligned):
// tile column cc is a row of qt; each thread writes 8 consecutive rows of x there, one 8-byte
// store. Call after a __syncthreads that completes the tile.
__device__ __forceinline__ void store_tile_transposed(const uint8_t (*tile)[kVecPitch], int64_t r0, int64_t c0,
                                                      int64_t R, int64_t C, uint8_t* __restrict__ qt) {
  for (int j = threadIdx.x; j < kVecTile * 8; j += kVecThreads) {
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
