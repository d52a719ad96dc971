#pragma once
// Bit-exact re-implementations of the two numpy random streams Megatron's datasets consume:
//  - numpy.random.RandomState(seed).shuffle (legacy MT19937 + numpy's Fisher-Yates with masked
//    rejection sampling): GPTDataset's document and shuffle indices.
//  - numpy.random.default_rng(seed).integers(low, high, dtype=int32) (SeedSequence -> PCG64 ->
//    Lemire's bounded integers): MockGPTLowLevelDataset's document lengths.
// Matching numpy exactly is what makes our sample order identical to Megatron-LM's.
#include <cstdint>
#include <random>
#include <vector>

namespace mt::data {

class NumpyRandomState {
 public:
  // numpy seeds the legacy MT19937 with init_genrand, which is what std::mt19937 does.
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t next_uint32() { return static_cast<uint32_t>(mt_()); }
  uint64_t next_uint64() {
    const uint64_t hi = next_uint32();
    return hi << 32 | next_uint32();
  }
  // A uniform integer in [0, max] by masked rejection (numpy's random_interval).
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle of a 1-D array: for i = n-1 .. 1 swap x[i] with x[random_interval(i)].
  template <typename T>
  void shuffle(T* x, int64_t n) {
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(random_interval(static_cast<uint64_t>(i)));
      std::swap(x[i], x[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

// numpy's PCG64 (XSL-RR 128/64) with its 32-bit output buffering.
class Pcg64 {
 public:
  // Seeded as numpy.random.default_rng(seed) seeds it (through SeedSequence(seed)).
  explicit Pcg64(uint64_t seed);
  uint64_t next_uint64();
  uint32_t next_uint32();

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// SeedSequence(entropy).generate_state(n_words, uint32) for a non-negative integer entropy.
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, size_t n_words);

// Generator.integers(low, high, size=n, dtype=int32) with endpoint=False.
std::vector<int32_t> numpy_integers_int32(Pcg64& rng, int64_t low, int64_t high, size_t n);

}  // namespace mt::data
