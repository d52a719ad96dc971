#include "data/blended_config.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace mt::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Valid: return "valid";
    case Split::Test: return "test";
  }
  return "?";
}

// numpy's pairwise_sum: plain loop below 8 elements, 8 accumulators up to 128, halves above.
double numpy_sum(const double* a, size_t n) {
  if (n < 8) {
    double res = 0.0;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum(a, n2) + numpy_sum(a + n2, n - n2);
}

std::vector<double> normalize_weights(const std::vector<double>& w) {
  const double s = numpy_sum(w.data(), w.size());
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = w[i] / s;
  return out;
}

namespace {

// Python's float(): the whole token must be a number.
bool parse_float(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

}  // namespace

std::vector<double> parse_and_normalize_split(const std::string& split) {
  // re.findall(r"[.0-9]+", split): every run of digits and dots is one weight.
  std::vector<double> v;
  for (size_t i = 0; i < split.size();) {
    if (std::isdigit(static_cast<unsigned char>(split[i])) || split[i] == '.') {
      size_t j = i;
      while (j < split.size() && (std::isdigit(static_cast<unsigned char>(split[j])) || split[j] == '.')) ++j;
      double x;
      if (!parse_float(split.substr(i, j - i), &x)) {
        fail("--split '{}': '{}' is not a number; give up to three weights like 969,30,1", split,
             split.substr(i, j - i));
      }
      v.push_back(x);
      i = j;
    } else {
      ++i;
    }
  }
  if (v.size() > 3) fail("--split '{}' has {} weights; give at most three (train,valid,test)", split, v.size());
  while (v.size() < 3) v.push_back(0.0);
  if (numpy_sum(v.data(), v.size()) <= 0.0) {
    fail("--split '{}' gives every split weight 0; give positive weights like 969,30,1", split);
  }
  return normalize_weights(v);
}

SplitMatrix split_matrix_from_vector(const std::vector<double>& v) {
  SplitMatrix m;
  double lo = 0.0;
  for (size_t i = 0; i < 3; ++i) {
    const double hi = lo + v[i];
    if (hi > lo) m[i] = std::make_pair(lo, hi);
    lo = hi;
  }
  return m;
}

std::pair<int64_t, int64_t> split_range(const std::pair<double, double>& bookend, int64_t count) {
  // Python's round() rounds half to even, which is nearbyint in the default rounding mode.
  const double n = static_cast<double>(count);
  return {static_cast<int64_t>(std::nearbyint(bookend.first * n)),
          static_cast<int64_t>(std::nearbyint(bookend.second * n))};
}

Blend parse_blend(const std::vector<std::string>& list, const std::string& flag) {
  std::vector<std::string> items;
  for (const auto& entry : list) {
    std::istringstream ss(entry);
    std::string tok;
    while (ss >> tok) items.push_back(tok);
  }
  Blend b;
  if (items.empty()) return b;
  if (items.size() % 2 == 0) {
    std::vector<double> w;
    size_t numeric = 0;
    for (size_t i = 0; i < items.size(); i += 2) {
      double x;
      if (parse_float(items[i], &x)) {
        ++numeric;
        w.push_back(x);
      }
    }
    if (numeric == items.size() / 2) {
      for (size_t i = 1; i < items.size(); i += 2) b.prefixes.push_back(items[i]);
      for (double x : w) {
        if (!(x >= 0.0) || std::isinf(x)) fail("{}: weight {} must be a finite number >= 0", flag, x);
      }
      if (numpy_sum(w.data(), w.size()) <= 0.0) fail("{}: the weights sum to 0; give positive weights", flag);
      b.weights = std::move(w);
      return b;
    }
    if (numeric != 0) {
      fail("{}: mixes weighted and unweighted entries; give either 'PREFIX ...' or "
           "'WEIGHT PREFIX WEIGHT PREFIX ...'", flag);
    }
  }
  b.prefixes = std::move(items);
  return b;
}

int64_t blend_dataset_size(double normalized_weight, int64_t target, double surplus) {
  return static_cast<int64_t>(
      std::ceil(std::ceil(static_cast<double>(target) * normalized_weight) * (1.0 + surplus)));
}

}  // namespace mt::data
