#pragma once
// Unicode normalization tables (generated into unicode_norm_data.cpp).
#include <cstddef>
#include <cstdint>

namespace mt::data::unicode_data {

struct CccRun {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomp {
  char32_t cp;
  uint16_t offset;  // into kDecompPool
  uint8_t len;
};
struct Composition {
  uint64_t key;  // first << 21 | second
  char32_t cp;
};

extern const char* const kUnicodeVersion;
extern const CccRun kCccRuns[];
extern const size_t kCccRunCount;
extern const char32_t kDecompPool[];
extern const Decomp kCanonical[];  // full canonical decompositions (NFD of one character)
extern const size_t kCanonicalCount;
extern const Decomp kCompat[];     // full compatibility decompositions, where they differ
extern const size_t kCompatCount;
extern const Decomp kLower[];       // full lowercase mappings (char::to_lowercase), where not identity
extern const size_t kLowerCount;
extern const Composition kCompositions[];  // primary composites, sorted by key
extern const size_t kCompositionCount;

}  // namespace mt::data::unicode_data
