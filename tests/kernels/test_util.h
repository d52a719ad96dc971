#pragma once
// Helpers shared by the CPU and GPU kernel tests: random data, finite-difference gradient checks in
// fp64, and running a callable under a given OpenMP thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/moe_routing.h"

namespace mt::test {

// An MoE router of E experts choosing k (kernels/moe_routing.h), its other settings at their
// defaults.
inline ops::RouterSpec router_spec(int64_t E, int64_t k,
                                   ops::RouterSpec::Score score = ops::RouterSpec::Score::Softmax) {
  ops::RouterSpec sp;
  sp.num_experts = E;
  sp.topk = k;
  sp.score = score;
  return sp;
}

// v with every value rounded to bf16 (the inputs a bf16 kernel and its fp32 reference share).
inline std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

template <typename T = double>
std::vector<T> random_vec(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// ||got - want|| / ||want|| in fp64 (the GPU tests' error measure); inf when got has a non-finite value.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

// Largest |a - b|; NaN propagates.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;
  }
  return m;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] against the central difference of loss() in x[i], for every i in `which`
// (all of x when empty). loss() must read x. Tolerance is relative to the element, with a floor
// relative to the largest gradient so that near-zero entries do not demand absolute accuracy
// below finite-difference noise.
template <typename Loss>
void expect_grad(const char* what, std::vector<double>& x, const std::vector<double>& analytic, Loss loss,
                 std::vector<size_t> which = {}, double rtol = 1e-6, double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  if (which.empty())
    for (size_t i = 0; i < x.size(); ++i) which.push_back(i);
  double gmax = 0;
  for (double g : analytic) gmax = std::max(gmax, std::abs(g));
  int failures = 0;
  for (size_t i : which) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    const double fd = (lp - lm) / (2 * h);
    const double tol = rtol * std::max({std::abs(fd), 1e-2 * gmax, 1e-6});
    if (std::abs(analytic[i] - fd) > tol && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " vs finite difference " << fd;
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << which.size() << " entries off";
}

// `count` distinct indices in [0, n), spread pseudo-randomly (for large tensors).
inline std::vector<size_t> sample_indices(size_t n, size_t count, uint64_t seed) {
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(std::min(n, count));
  return all;
}

template <typename F>
void with_threads(int n, F&& f) {
  const int old = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(old);
}

template <typename T>
bool bit_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename A, typename B>
double max_rel_err(const std::vector<A>& got, const std::vector<B>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    den = std::max(den, std::abs(static_cast<double>(want[i])));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace mt::test
