#pragma once
// Blockwise FP8 scaling (DeepSeek-V3's recipe) as cuBLASLt's block-scaled FP8 GEMMs read it on
// Hopper: where each operand's f32 scales live. Shared by the CPU reference, the CUDA cast
// kernels and the GEMM call (host and device code).
//
// An operand is [outer, K] with K contiguous (Hopper's FP8 GEMMs read both operands K-major), its
// codes scaled in one of two tilings:
//   Rows1x128      (cuBLASLt's VEC128_32F): a scale per run of 128 along K, stored [ceil(K/128)][outer]
//                  with outer fastest (the "outer-dimension-major" layout cuBLASLt expects);
//   Blocks128x128  (BLK128x128_32F): a scale per 128x128 block, stored [ceil(outer/128)][ld] with the
//                  K blocks fastest and ld = ceil(K/128) rounded up to 4 (cuBLASLt's padding; the
//                  padding holds zeros).
// The scales the GEMM reads are dequantization factors: a value is code * scale_inv. Both tilings
// may be mixed in one GEMM except Blocks x Blocks, which cuBLASLt does not run.
#include <cstdint>

#include "kernels/fp8_scale.h"

namespace mt {

enum class Fp8Tiles : uint8_t { Rows1x128, Blocks128x128 };

namespace fp8 {

constexpr int64_t kBlockTile = 128;

MT_FP8_HD inline int64_t tiles_of(int64_t n) { return (n + kBlockTile - 1) / kBlockTile; }
// The leading dimension of a Blocks128x128 scale tensor over K.
MT_FP8_HD inline int64_t blocks_ld(int64_t k) { return (tiles_of(k) + 3) / 4 * 4; }

// Number of f32 scales of an [outer, k] operand.
MT_FP8_HD inline int64_t tile_scales(Fp8Tiles t, int64_t outer, int64_t k) {
  return t == Fp8Tiles::Rows1x128 ? tiles_of(k) * outer : tiles_of(outer) * blocks_ld(k);
}
// Where the scale of element (o, kk) of an [outer, k] operand is.
MT_FP8_HD inline int64_t tile_scale_index(Fp8Tiles t, int64_t outer, int64_t k, int64_t o, int64_t kk) {
  return t == Fp8Tiles::Rows1x128 ? (kk / kBlockTile) * outer + o
                                  : (o / kBlockTile) * blocks_ld(k) + kk / kBlockTile;
}

}  // namespace fp8
}  // namespace mt
