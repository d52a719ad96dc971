#include "inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace mt::inference {

void check_sampling(const SamplingParams& p, const std::string& prefix) {
  // Written as "not in range" so that a NaN fails too.
  if (!(p.temperature >= 0.f) || std::isinf(p.temperature))
    fail("{}temperature must be >= 0 (got {})", prefix, p.temperature);
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) fail("{}top-p must be in (0, 1] (got {}); 1 keeps every token", prefix, p.top_p);
  if (p.top_k < 0) fail("{}top-k must be >= 0 (got {}); 0 keeps every token", prefix, p.top_k);
}

int32_t sample_token(std::vector<float> logits, float temperature, int64_t top_k, float top_p, float u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (temperature <= 0.f) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t keep_k = top_k > 0 ? std::min(top_k, V) : V;
  // Only the kept tokens need ordering (stable among equal logits: the lower id first).
  auto by_logit = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + keep_k, idx.end(), by_logit);
  int64_t keep = keep_k;
  double mx = logits[static_cast<size_t>(idx[0])];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i)
    sum += p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / temperature);
  if (top_p > 0.f && top_p < 1.f) {
    double c = 0;
    for (int64_t i = 0; i < keep; ++i) {
      c += p[static_cast<size_t>(i)] / sum;
      if (c >= top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double r = u * sum, c = 0;
  for (int64_t i = 0; i < keep; ++i) {
    c += p[static_cast<size_t>(i)];
    if (r < c) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

float sampling_uniform(uint64_t seed, int64_t n) { return Philox::uniform(seed, 7, static_cast<uint64_t>(n)); }

size_t find_stop(const std::string& text, const std::vector<std::string>& stops, std::string* which) {
  size_t best = std::string::npos;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const size_t at = text.find(s);
    if (at < best) {
      best = at;
      if (which) *which = s;
    }
  }
  return best;
}

}  // namespace mt::inference
