#include "data/tokenizers/unicode_norm.h"

#include <algorithm>
#include <vector>

#include "data/tokenizers/unicode_norm_data.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {

namespace ud = unicode_data;

namespace {

// Hangul syllables are composed arithmetically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

const ud::Decomp* find_decomp(const ud::Decomp* table, size_t n, char32_t cp) {
  const ud::Decomp* end = table + n;
  const ud::Decomp* it =
      std::lower_bound(table, end, cp, [](const ud::Decomp& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

void decompose(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp < 0xA0) {  // nothing below U+00A0 decomposes
    out.push_back(cp);
    return;
  }
  const ud::Decomp* d = compat ? find_decomp(ud::kCompat, ud::kCompatCount, cp) : nullptr;
  if (!d) d = find_decomp(ud::kCanonical, ud::kCanonicalCount, cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), ud::kDecompPool + d->offset, ud::kDecompPool + d->offset + d->len);
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
  const ud::Composition* end = ud::kCompositions + ud::kCompositionCount;
  const ud::Composition* it = std::lower_bound(
      ud::kCompositions, end, key, [](const ud::Composition& c, uint64_t k) { return c.key < k; });
  return it != end && it->key == key ? it->cp : 0;
}

bool is_ascii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

}  // namespace

int combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const ud::CccRun* end = ud::kCccRuns + ud::kCccRunCount;
  const ud::CccRun* it = std::upper_bound(
      ud::kCccRuns, end, cp, [](char32_t c, const ud::CccRun& r) { return c < r.first; });
  if (it == ud::kCccRuns) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

std::string unicode_lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    const char32_t cp = utf8::next(text, i);
    const ud::Decomp* d = find_decomp(ud::kLower, ud::kLowerCount, cp);
    if (!d) {
      utf8::append(out, cp);
      continue;
    }
    for (uint8_t k = 0; k < d->len; ++k) utf8::append(out, ud::kDecompPool[d->offset + k]);
  }
  return out;
}

const char* unicode_norm_version() { return ud::kUnicodeVersion; }

std::string unicode_normalize(std::string_view text, NormForm form) {
  if (is_ascii(text)) return std::string(text);  // ASCII is invariant under every form
  const bool compat = form == NormForm::NFKC || form == NormForm::NFKD;
  const bool compose_after = form == NormForm::NFC || form == NormForm::NFKC;

  // 1. Full decomposition.
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) decompose(utf8::next(text, i), compat, cps);

  // 2. Canonical ordering: stable-sort each run of non-starters by combining class.
  std::vector<int> ccc(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) ccc[i] = combining_class(cps[i]);
  for (size_t i = 0; i < cps.size();) {
    if (ccc[i] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc[j] != 0) ++j;
    if (j - i > 1) {
      std::vector<std::pair<int, char32_t>> run;
      for (size_t k = i; k < j; ++k) run.emplace_back(ccc[k], cps[k]);
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t k = i; k < j; ++k) {
        ccc[k] = run[k - i].first;
        cps[k] = run[k - i].second;
      }
    }
    i = j;
  }

  // 3. Canonical composition: a character joins the last starter unless something between
  // them blocks it (a starter, or a mark of equal or higher class).
  if (compose_after && !cps.empty()) {
    size_t out = 0;
    long starter = -1;
    int last_ccc = -1;  // class of the last character kept after the starter; -1 if none
    for (size_t i = 0; i < cps.size(); ++i) {
      const int c = ccc[i];
      if (starter >= 0 && (last_ccc == -1 || (last_ccc < c && last_ccc != 0))) {
        const char32_t comp = compose(cps[starter], cps[i]);
        if (comp) {
          cps[starter] = comp;
          continue;
        }
      }
      if (c == 0) {
        starter = static_cast<long>(out);
        last_ccc = -1;
      } else {
        last_ccc = c;
      }
      cps[out] = cps[i];
      ccc[out] = c;
      ++out;
    }
    cps.resize(out);
  }

  std::string result;
  result.reserve(text.size() + 8);
  for (char32_t cp : cps) utf8::append(result, cp);
  return result;
}

}  // namespace mt::data
