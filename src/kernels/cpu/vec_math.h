#pragma once
// Small SIMD helpers on GCC vector extensions (SSE2 on baseline x86-64): a vectorised exp with
// our own polynomial, so softmax-like loops vectorise and give the same bits on every CPU and
// for any thread count (libm's exp does neither).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

namespace mt::cpu::vec {

template <typename T>
struct Bits;
template <>
struct Bits<float> {
  using U = uint32_t;
};
template <>
struct Bits<double> {
  using U = uint64_t;
};

// Bytes: 16 (SSE2, the baseline) or wider, which GCC lowers to several baseline operations or,
// in a function compiled for a wider unit (softmax_rows.cpp), to one: the same bits either way.
template <typename T, int Bytes = 16>
struct Vec {
  typedef T V __attribute__((vector_size(Bytes)));
  typedef typename Bits<T>::U UV __attribute__((vector_size(Bytes)));
  static constexpr int64_t N = Bytes / sizeof(T);
  [[gnu::always_inline]] static V load(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  [[gnu::always_inline]] static void store(T* p, V v) { std::memcpy(p, &v, sizeof v); }
};

// exp for the softmax, on a vector: 2^k * poly(r) with x = k ln2 + r, |r| <= ln2/2, and a
// Taylor polynomial (error ~1 ulp in float and double). Our own code rather than libm's
// because libm's loop does not vectorise (exp is the largest non-gemm cost here) and its
// result may change with the CPU variant libm picks. Results below ~exp(-87) (float) or
// exp(-708) (double) flush to 0, which is what softmax wants; -inf gives 0, NaN stays NaN.
template <typename T>
struct ExpConst;
template <>
struct ExpConst<float> {
  static constexpr float lo = -87.3f, hi = 88.0f, round = 0x1.8p23f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  // ln2_hi * k is exact
  static constexpr int mant = 23, bias = 127, degree = 7;
};
template <>
struct ExpConst<double> {
  static constexpr double lo = -708.0, hi = 709.0, round = 0x1.8p52;
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  static constexpr int mant = 52, bias = 1023, degree = 13;
};

template <typename T, int Bytes = 16>
[[gnu::always_inline]] inline typename Vec<T, Bytes>::V exp_vec(typename Vec<T, Bytes>::V x) {
  using E = ExpConst<T>;
  using V = typename Vec<T, Bytes>::V;
  using UV = typename Vec<T, Bytes>::UV;
  using U = typename Bits<T>::U;
  const V lo = V{} + E::lo, hi = V{} + E::hi;
  V xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // Adding 1.5 * 2^mant rounds x / ln2 to an integer k, which then sits in the low mantissa bits.
  const V y = xc * T(1.44269504088896340736) + E::round;
  const V kf = y - E::round;
  const UV k = (UV)y - std::bit_cast<U>(E::round);
  const V r = (xc - kf * E::ln2_hi) - kf * E::ln2_lo;
  constexpr auto inv_factorial = [](int n) {
    T f = 1;
    for (int i = 2; i <= n; ++i) f *= T(i);
    return T(1) / f;
  };
  V poly = V{} + inv_factorial(E::degree);
#pragma GCC unroll 16
  for (int n = E::degree - 1; n >= 0; --n) poly = poly * r + inv_factorial(n);
  const V two_k = (V)((k + U(E::bias)) << E::mant);
  return (V)((UV)(poly * two_k) & ~(UV)(x < lo));  // a NaN compares false and stays NaN
}

// exp of one value through the vector code (the same bits as exp_shifted's lanes).
template <typename T>
T exp_scalar(T x) {
  using W = Vec<T>;
  T lanes[W::N] = {};
  lanes[0] = x;
  W::store(lanes, exp_vec<T>(W::load(lanes)));
  return lanes[0];
}

// x[j] = exp(x[j] - shift) for j < n; the tail goes through the same vector code.
template <typename T, int Bytes = 16>
[[gnu::always_inline]] inline void exp_shifted(T* x, int64_t n, T shift) {
  using W = Vec<T, Bytes>;
  int64_t j = 0;
  for (; j + W::N <= n; j += W::N) W::store(x + j, exp_vec<T, Bytes>(W::load(x + j) - shift));
  if (j < n) {
    T tail[W::N] = {};
    std::copy(x + j, x + n, tail);
    W::store(tail, exp_vec<T, Bytes>(W::load(tail) - shift));
    std::copy(tail, tail + (n - j), x + j);
  }
}

// sum_j x[j] in double, in a fixed order (8 interleaved lanes, then the tail): vectorisable and
// independent of the thread count. For the softmax's exp terms, which lie in (0, 1].
template <typename T>
double sum_lanes(const T* x, int64_t n) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += x[j + l];
  double sum = 0;
  for (int l = 0; l < 8; ++l) sum += lanes[l];
  for (; j < n; ++j) sum += x[j];
  return sum;
}

}  // namespace mt::cpu::vec
