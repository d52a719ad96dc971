#pragma once
// A thread-safe cache from a pre-token (bytes) to its BPE ids. Natural text repeats a small set
// of words, so most pre-tokens are answered here instead of by the merge loop. Sharded by hash so
// that worker threads encoding different documents rarely wait on one another.
#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mt::data {

class WordCache {
 public:
  // Words longer than this are rare repeats and not worth the memory.
  static constexpr size_t kMaxWordBytes = 256;

  // Appends the cached ids of `word` to `out` and returns true, or returns false on a miss.
  bool lookup(std::string_view word, std::vector<int32_t>& out) const {
    if (word.size() > kMaxWordBytes) return false;
    const size_t h = std::hash<std::string_view>{}(word);
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const int32_t* ids, size_t n) const {
    if (word.size() > kMaxWordBytes) return;
    const size_t h = std::hash<std::string_view>{}(word);
    Shard& s = shards_[h % kShards];
    std::lock_guard<std::mutex> lock(s.mu);
    // Bounded memory: a full shard starts over rather than tracking recency.
    if (s.map.size() >= kShardCapacity) s.map.clear();
    s.map.try_emplace(std::string(word), ids, ids + n);
  }

 private:
  static constexpr size_t kShards = 32;
  static constexpr size_t kShardCapacity = 16384;

  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
  };
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace mt::data
