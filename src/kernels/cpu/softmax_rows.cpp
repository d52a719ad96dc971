// The float versions are compiled three times (target_clones: AVX-512, AVX2, baseline SSE2) and
// the loader picks the widest the CPU has. They compute with 64-byte GCC vectors, which each
// target lowers to one or several of its own instructions doing the same IEEE operations lane by
// lane; floating-point contraction is off for this file (GCC would otherwise fuse a * b + c into
// an FMA where the target has one, rounding once instead of twice), so every target gives the
// baseline's bits: results depend neither on the CPU's vendor nor its vector width.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif
// The 64-byte vectors live inside the (always inlined) helpers of this file: no call passes one,
// so the compilers' note that their calling convention differs between targets does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/cpu/softmax_rows.h"

#include <algorithm>
#include <limits>

#include "kernels/cpu/vec_math.h"

namespace mt::cpu {

namespace {

constexpr int kBytes = 64;

template <typename T>
[[gnu::always_inline]] inline ExpSum exp_sum_impl(T* row, int64_t n) {
  using W = vec::Vec<T, kBytes>;
  using V = typename W::V;
  // The max in vector lanes: exact, so the lane split cannot change it.
  // (NaN never wins a comparison, as in std::max's loop: a NaN logit gives a NaN sum instead.)
  T m = -std::numeric_limits<T>::infinity();
  V mv = V{} + m;
  int64_t j = 0;
  for (; j + W::N <= n; j += W::N) {
    const V x = W::load(row + j);
    mv = mv < x ? x : mv;
  }
  for (int l = 0; l < W::N; ++l) m = std::max(m, mv[l]);
  for (; j < n; ++j) m = std::max(m, row[j]);
  vec::exp_shifted<T, kBytes>(row, n, m);
  return {static_cast<double>(m), vec::sum_lanes(row, n)};
}

}  // namespace

#if defined(__x86_64__)
#define MT_WIDEST_X86 __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MT_WIDEST_X86
#endif

MT_WIDEST_X86 ExpSum exp_sum_row(float* row, int64_t n) { return exp_sum_impl(row, n); }
ExpSum exp_sum_row(double* row, int64_t n) { return exp_sum_impl(row, n); }

MT_WIDEST_X86 void scale_row(float* row, int64_t n, float f) {
  for (int64_t j = 0; j < n; ++j) row[j] *= f;
}
void scale_row(double* row, int64_t n, double f) {
  for (int64_t j = 0; j < n; ++j) row[j] *= f;
}

MT_WIDEST_X86 void add_row(float* d, const float* s, int64_t n) {
  for (int64_t k = 0; k < n; ++k) d[k] += s[k];
}
void add_row(double* d, const double* s, int64_t n) {
  for (int64_t k = 0; k < n; ++k) d[k] += s[k];
}

}  // namespace mt::cpu
