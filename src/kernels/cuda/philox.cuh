#pragma once
// Device Philox4x32-10, the same generator and counter layout as core/philox.h: counter =
// (index lo, index hi, offset lo, offset hi), key = (seed lo, seed hi), uniform = (r >> 8) * 2^-24.
// Integer arithmetic only, so the numbers equal the host's bit for bit (tested).
#include <cstdint>

namespace mt::cuda {

struct Philox4 {
  uint32_t x, y, z, w;
};

__device__ __forceinline__ Philox4 philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
    const uint32_t hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return {c0, c1, c2, c3};
}

__device__ __forceinline__ float philox_to_unit(uint32_t r) {
  return static_cast<float>(r >> 8) * (1.0f / 16777216.0f);
}

// Philox::uniform(seed, offset, i).
__device__ __forceinline__ float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  const Philox4 b = philox_block(seed, offset, i >> 2);
  const uint32_t l = static_cast<uint32_t>(i & 3);
  const uint32_t r = l == 0 ? b.x : l == 1 ? b.y : l == 2 ? b.z : b.w;
  return philox_to_unit(r);
}

}  // namespace mt::cuda
