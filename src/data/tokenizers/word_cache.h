#pragma once
// A thread-safe cache from a pre-token (bytes) to its BPE ids. Natural text repeats a small set
// of words, so most pre-tokens are answered here instead of by the merge loop.
//
// Open addressing with each entry in one 64-byte slot (short word and its ids inline), so a hit
// costs about one cache miss; node-based maps cost three. Sharded by hash, one mutex per shard,
// so worker threads rarely wait on one another. Words or results too long for a slot are not
// cached (they are rare); a full probe window overwrites its first slot.
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace mt::data {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 22;
  static constexpr size_t kMaxIds = 8;

  WordCache() {
    for (auto& s : shards_) s.slots.reset(new Slot[kSlotsPerShard]());
  }

  // Appends the cached ids of `word` to `out` and returns true, or returns false on a miss.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty() || word.size() > kMaxWordBytes) return false;
    const uint64_t h = hash(word);
    Shard& s = shard(h);
    std::lock_guard<std::mutex> lock(s.mu);
    for (size_t k = 0; k < kProbe; ++k) {
      const Slot& slot = s.slots[(h + k) & (kSlotsPerShard - 1)];
      if (slot.len == 0) return false;  // slots are never emptied: the word is not further on
      if (slot.hash == h && slot.len == word.size() &&
          std::memcmp(slot.word, word.data(), word.size()) == 0) {
        out.insert(out.end(), slot.ids, slot.ids + slot.nids);
        return true;
      }
    }
    return false;
  }

  void insert(std::string_view word, const int32_t* ids, size_t n) const {
    if (word.empty() || word.size() > kMaxWordBytes || n > kMaxIds) return;
    const uint64_t h = hash(word);
    Shard& s = shard(h);
    std::lock_guard<std::mutex> lock(s.mu);
    Slot* target = &s.slots[h & (kSlotsPerShard - 1)];
    for (size_t k = 0; k < kProbe; ++k) {
      Slot& slot = s.slots[(h + k) & (kSlotsPerShard - 1)];
      if (slot.len == 0 || (slot.hash == h && slot.len == word.size() &&
                            std::memcmp(slot.word, word.data(), word.size()) == 0)) {
        target = &slot;
        break;
      }
    }
    target->hash = h;
    target->len = static_cast<uint8_t>(word.size());
    target->nids = static_cast<uint8_t>(n);
    std::memcpy(target->word, word.data(), word.size());
    std::memcpy(target->ids, ids, n * sizeof(int32_t));
  }

 private:
  static constexpr size_t kShards = 32;
  static constexpr size_t kSlotsPerShard = 8192;  // 32 x 8192 x 64 B = 16 MiB, touched lazily
  static constexpr size_t kProbe = 8;

  struct alignas(64) Slot {
    uint64_t hash;
    uint8_t len;  // 0: empty
    uint8_t nids;
    char word[kMaxWordBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Slot) == 64);

  struct Shard {
    std::mutex mu;
    std::unique_ptr<Slot[]> slots;
  };

  static uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  Shard& shard(uint64_t h) const { return shards_[(h >> 40) % kShards]; }

  mutable std::array<Shard, kShards> shards_;
};

}  // namespace mt::data
