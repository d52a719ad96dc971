#include "data/tokenizers/bpe.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {

Bpe::Bpe(VocabMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         BpeOptions opts, std::string_view what)
    : vocab_(std::move(vocab)), opts_(std::move(opts)), what_(what) {
  merges_.reserve(merges.size() * 2);
  for (const auto& [tok, id] : vocab_) {
    size_t i = 0;
    if (!tok.empty() && utf8::valid_prefix(tok) == tok.size()) {
      const char32_t cp = utf8::next(tok, i);
      if (i == tok.size()) char_id_.emplace(cp, id);
    }
  }
  const size_t prefix_len = opts_.continuing_subword_prefix.size();
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const int32_t ia = find(a), ib = find(b);
    // The merged token drops the right part's continuation prefix (HF tokenizers' rule).
    std::string merged = a;
    merged.append(std::string_view(b).substr(std::min(prefix_len, b.size())));
    const int32_t im = find(merged);
    if (ia < 0 || ib < 0 || im < 0) {
      fail("{}: merge #{} '{} {}' uses a token missing from the vocabulary; the vocabulary and "
           "merges do not belong together", what_, r, a, b);
    }
    // A repeated pair keeps its last rank, as every reference implementation's dict does.
    merges_.insert_or_assign(key(ia, ib), Merge{static_cast<int32_t>(r), im});
  }
  for (int b = 0; b < 256; ++b) {
    unit_id_[b] = find(std::string(1, static_cast<char>(b)));
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_token_[b] = find(name);
  }
}

void Bpe::enable_metaspace_cuts() {
  static constexpr std::string_view kMeta = "\xE2\x96\x81";
  if (opts_.byte_units || !opts_.continuing_subword_prefix.empty() ||
      !opts_.end_of_word_suffix.empty() || find(kMeta) < 0) {
    return;  // the argument for cutting needs plain character units
  }
  for (const auto& [tok, id] : vocab_) {
    for (size_t i = 0; i < tok.size();) {
      const char32_t c = utf8::next(tok, i);
      if (c != 0x2581 && std::string_view(tok).substr(i).starts_with(kMeta)) {
        glued_to_metaspace_[c] = true;
      }
    }
  }
  metaspace_cuts_ = true;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (!metaspace_cuts_ || word.size() <= 64) {
    encode_part(word, out);
    return;
  }
  size_t start = 0;
  char32_t prev = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t at = i;
    const char32_t c = utf8::next(word, i);
    // Only after a character that is its own token: byte-fallback and unk symbols have other
    // spellings (e.g. "<0x3E>") that the vocabulary check above does not see.
    if (c == 0x2581 && at > start && prev != 0x2581 && !glued_to_metaspace_.count(prev) &&
        char_id_.count(prev)) {
      encode_part(word.substr(start, at - start), out);
      start = at;
    }
    prev = c;
  }
  encode_part(word.substr(start), out);
}

void Bpe::encode_part(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (cache_.lookup(word, out)) return;
  if (opts_.ignore_merges) {
    const int32_t id = find(word);
    if (id >= 0) {
      out.push_back(id);
      cache_.insert(word, &id, 1);
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  cache_.insert(word, out.data() + start, out.size() - start);
}

// Appends the symbols for a character missing from the vocabulary.
void Bpe::unknown(std::string_view ch, std::vector<int32_t>& out, bool& last_unk) const {
  if (opts_.byte_fallback) {
    bool all = true;
    for (unsigned char c : ch) all = all && byte_token_[c] >= 0;
    if (all) {
      for (unsigned char c : ch) out.push_back(byte_token_[c]);
      last_unk = false;
      return;
    }
  }
  if (opts_.unk_id < 0) {
    fail("{}: '{}' is not in the vocabulary and the model has no unk_token; this text cannot be "
         "encoded with this tokenizer", what_, ch);
  }
  if (!(opts_.fuse_unk && last_unk)) out.push_back(opts_.unk_id);
  last_unk = true;
}

namespace {

struct Sym {
  int32_t id;
  int32_t prev;
  int32_t next;
};

struct Candidate {
  int32_t rank;
  int32_t left;  // index of the left symbol; merged symbols keep it, so it orders by position
  int32_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t new_id;
  // std::push_heap builds a max-heap: "less" means lower priority.
  bool operator<(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  // Scratch buffers reused across calls on this thread: uncached words allocate nothing.
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Candidate> heap;
  thread_local std::vector<int32_t> ids;
  thread_local std::string unit;
  syms.clear();
  heap.clear();

  // 1. Initial symbols: one per byte or code point.
  bool last_unk = false;
  size_t i = 0;
  bool first = true;
  while (i < word.size()) {
    const size_t n = opts_.byte_units ? 1 : utf8::char_len(static_cast<unsigned char>(word[i]));
    const std::string_view ch = word.substr(i, n);
    i += n;
    const bool last = i >= word.size();
    int32_t id;
    if (opts_.continuing_subword_prefix.empty() && opts_.end_of_word_suffix.empty()) {
      if (opts_.byte_units) {
        id = unit_id_[static_cast<unsigned char>(ch[0])];
      } else {
        size_t k = 0;
        auto it = char_id_.find(utf8::next(ch, k));
        id = it == char_id_.end() ? -1 : it->second;
      }
    } else {
      unit.clear();
      if (!first) unit += opts_.continuing_subword_prefix;
      unit += ch;
      if (last) unit += opts_.end_of_word_suffix;
      id = find(unit);
    }
    first = false;
    if (id >= 0) {
      syms.push_back({id, 0, 0});
      last_unk = false;
      continue;
    }
    ids.clear();
    unknown(ch, ids, last_unk);
    for (int32_t x : ids) syms.push_back({x, 0, 0});
  }
  const auto n = static_cast<int32_t>(syms.size());
  for (int32_t k = 0; k < n; ++k) {
    syms[k].prev = k - 1;
    syms[k].next = k + 1 < n ? k + 1 : -1;
  }

  // 2. Merge the best-ranked adjacent pair until none is left.
  auto push = [&](int32_t left) {
    const int32_t right = syms[left].next;
    if (right < 0) return;
    auto it = merges_.find(key(syms[left].id, syms[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, right, syms[left].id, syms[right].id, it->second.id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    Sym& l = syms[c.left];
    // Stale entries: a side was merged away or changed since this pair was queued. Symbols only
    // grow, so an unchanged id means an unchanged symbol.
    if (l.id != c.left_id || l.next != c.right || syms[c.right].id != c.right_id) continue;
    Sym& r = syms[c.right];
    l.id = c.new_id;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;  // dead
    if (l.prev >= 0) push(l.prev);
    push(c.left);
  }

  // 3. Read the surviving symbols in order.
  for (int32_t k = n > 0 ? 0 : -1; k >= 0; k = syms[k].next) out.push_back(syms[k].id);
}

}  // namespace mt::data
