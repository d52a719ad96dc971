#include "data/numpy_random.h"

#include "core/error.h"

namespace mt::data {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;  // the smallest all-ones mask covering max
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

// ---------------------------------------------------------------- SeedSequence

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

}  // namespace

std::vector<uint32_t> seed_sequence_state(uint64_t entropy, size_t n_words) {
  // The integer's 32-bit words, least significant first ([0] for zero).
  std::vector<uint32_t> words;
  do {
    words.push_back(static_cast<uint32_t>(entropy & 0xffffffffu));
    entropy >>= 32;
  } while (entropy != 0);

  uint32_t pool[kPoolSize];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < words.size() ? words[i] : 0, hash_const);
  for (size_t src = 0; src < kPoolSize; ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    }
  }
  for (size_t src = kPoolSize; src < words.size(); ++src) {
    for (size_t dst = 0; dst < kPoolSize; ++dst) pool[dst] = mix(pool[dst], hashmix(words[src], hash_const));
  }

  std::vector<uint32_t> state(n_words);
  uint32_t hb = kInitB;
  for (size_t i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    state[i] = v;
  }
  return state;
}

// ---------------------------------------------------------------- PCG64

namespace {

using u128 = unsigned __int128;
const u128 kPcgMult = (static_cast<u128>(0x2360ed051fc65da4ULL) << 64) | 0x4385df649fccf645ULL;

}  // namespace

Pcg64::Pcg64(uint64_t seed) {
  // generate_state(4, uint64): words pair up little-endian into (seed_hi, seed_lo, inc_hi, inc_lo).
  const auto w = seed_sequence_state(seed, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = static_cast<uint64_t>(w[2 * i]) | static_cast<uint64_t>(w[2 * i + 1]) << 32;
  const u128 initstate = static_cast<u128>(v[0]) << 64 | v[1];
  const u128 initseq = static_cast<u128>(v[2]) << 64 | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t Pcg64::next_uint64() {
  state_ = state_ * kPcgMult + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t Pcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

std::vector<int32_t> numpy_integers_int32(Pcg64& rng, int64_t low, int64_t high, size_t n) {
  MT_CHECK(low < high && low >= INT32_MIN && high - 1 <= INT32_MAX, "integers({}, {})", low, high);
  const uint32_t range = static_cast<uint32_t>(high - 1 - low);  // inclusive span
  std::vector<int32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t r;
    if (range == 0) {
      r = 0;
    } else if (range == 0xffffffffu) {
      r = rng.next_uint32();
    } else {
      // Lemire's nearly-divisionless bounded integers, as numpy's buffered_bounded_lemire_uint32.
      const uint32_t excl = range + 1;
      uint64_t m = static_cast<uint64_t>(rng.next_uint32()) * excl;
      uint32_t leftover = static_cast<uint32_t>(m);
      if (leftover < excl) {
        const uint32_t threshold = (0xffffffffu - range) % excl;
        while (leftover < threshold) {
          m = static_cast<uint64_t>(rng.next_uint32()) * excl;
          leftover = static_cast<uint32_t>(m);
        }
      }
      r = static_cast<uint32_t>(m >> 32);
    }
    out[i] = static_cast<int32_t>(low + static_cast<int64_t>(r));
  }
  return out;
}

}  // namespace mt::data
