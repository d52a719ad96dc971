#pragma once
// Size arithmetic on untrusted numbers (file headers, config files, flags): every product and sum
// that decides an allocation or an offset goes through these, so an overflow becomes an error
// naming its source instead of a wrapped size and a crash later.
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/error.h"

namespace mt {

// a * b for non-negative sizes; throws mt::Error "<what>: ... is too large" on overflow or a
// negative factor.
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  if (a < 0 || b < 0) fail("{}: negative size ({} x {})", what, a, b);
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("{}: size {} x {} is too large", what, a, b);
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  if (a < 0 || b < 0) fail("{}: negative size ({} + {})", what, a, b);
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail("{}: size {} + {} is too large", what, a, b);
  return r;
}

// The product of a shape's dimensions (1 for an empty shape).
template <typename Range>
int64_t checked_product(const Range& dims, const std::string& what) {
  int64_t r = 1;
  for (auto d : dims) r = checked_mul(r, static_cast<int64_t>(d), what);
  return r;
}

inline int64_t checked_product(std::initializer_list<int64_t> dims, const std::string& what) {
  int64_t r = 1;
  for (auto d : dims) r = checked_mul(r, d, what);
  return r;
}

}  // namespace mt
