#pragma once
// Philox4x32-10 counter-based RNG (Salmon et al., 2011), the generator CUDA's curand and
// PyTorch use. Counter-based means any element's random number is a pure function of
// (seed, offset, index): dropout masks are regenerated in backward instead of stored, and
// CPU and GPU kernels can draw identical streams.
#include <array>
#include <cstdint>

namespace mt {

struct Philox {
  static std::array<uint32_t, 4> block(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; ++r) {
      uint64_t p0 = static_cast<uint64_t>(M0) * ctr[0];
      uint64_t p1 = static_cast<uint64_t>(M1) * ctr[2];
      ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
             static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
      key[0] += W0;
      key[1] += W1;
    }
    return ctr;
  }
  // Four uniform floats in [0, 1) for counter block `index` of stream (seed, offset).
  static std::array<float, 4> uniform4(uint64_t seed, uint64_t offset, uint64_t index) {
    auto r = block({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                    static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)},
                   {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    std::array<float, 4> out;
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(r[i] >> 8) * (1.0f / 16777216.0f);
    return out;
  }
  static float uniform(uint64_t seed, uint64_t offset, uint64_t i) { return uniform4(seed, offset, i / 4)[i % 4]; }
};

// A stream of Philox draws with a seed and a running offset: each consumer takes a fresh
// offset range, so results do not depend on thread counts. Saved in checkpoints.
struct RngState {
  uint64_t seed = 1234;
  uint64_t offset = 0;
  uint64_t next_offset(uint64_t n = 1) {
    uint64_t o = offset;
    offset += n;
    return o;
  }
  // Standard normal via Box-Muller on Philox draws: n values from a fresh offset.
  void normal(float* out, int64_t n, float mean, float std);
  // Draws [first, first + n) of the normal stream at `offset` (as `normal` fills them), without
  // drawing the rest: a TP rank initialises only its shard of a weight. Draw i is a pure
  // function of (seed, offset, i), so the result does not depend on the thread count.
  void normal_slice(uint64_t offset, int64_t first, int64_t n, float* out, float mean, float std) const;
};

}  // namespace mt
