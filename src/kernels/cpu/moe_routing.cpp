// CPU reference of MoE routing (kernels/moe_routing.h): top-k with its score functions, the
// load-balancing statistics and their gradients, and token dropping. Every sum runs in a fixed
// order (tokens ascending, experts ascending), so results do not depend on threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/moe.h"

namespace mt::cpu {
namespace {

using Spec = ops::RouterSpec;

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
T softmax_row(const T* l, int64_t E, T* out) {  // returns logsumexp
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t e = 0; e < E; ++e) m = std::max(m, l[e]);
  T sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (out[e] = std::exp(l[e] - m));
  for (int64_t e = 0; e < E; ++e) out[e] /= sum;
  return m + std::log(sum);
}

// The k largest of v[0:E) among `allowed` (null: all), ties to the lower index, in descending order.
template <class T>
void topk(const T* v, int64_t E, int64_t k, const std::vector<char>* allowed, std::vector<int64_t>& idx) {
  idx.clear();
  std::vector<char> taken(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      if (taken[e] || (allowed && !(*allowed)[e])) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    MT_CHECK(best >= 0, "moe topk: fewer than {} candidate experts", k);
    taken[best] = 1;
    idx.push_back(best);
  }
}

// Group-limited routing: the experts of the group_topk best groups (by the sum of each group's
// top-(k / group_topk) values).
template <class T>
void group_mask(const T* v, const Spec& sp, std::vector<char>& allowed) {
  const int64_t E = sp.num_experts, G = sp.num_groups, gs = E / G, per = sp.topk / sp.group_topk;
  std::vector<T> gscore(static_cast<size_t>(G));
  std::vector<int64_t> idx;
  for (int64_t g = 0; g < G; ++g) {
    topk(v + g * gs, gs, per, nullptr, idx);
    T s = 0;
    for (int64_t i : idx) s += v[g * gs + i];
    gscore[g] = s;
  }
  topk(gscore.data(), G, sp.group_topk, nullptr, idx);
  allowed.assign(static_cast<size_t>(E), 0);
  for (int64_t g : idx)
    for (int64_t e = 0; e < gs; ++e) allowed[g * gs + e] = 1;
}

template <class T>
void choose(const T* v, const Spec& sp, std::vector<int64_t>& idx) {
  std::vector<char> allowed;
  if (sp.num_groups > 0) group_mask(v, sp, allowed);
  topk(v, sp.num_experts, sp.topk, sp.num_groups > 0 ? &allowed : nullptr, idx);
}

// Sinkhorn's balanced assignment scores, d1 * exp(logits) * d0 (Megatron's sinkhorn), at most
// max_sinkhorn_iters rounds.
template <class T>
std::vector<T> sinkhorn(const T* logits, int64_t n, const Spec& sp) {
  const int64_t E = sp.num_experts;
  std::vector<T> cost(static_cast<size_t>(n * E)), d0(static_cast<size_t>(n), T(1)), d1(static_cast<size_t>(E), T(1));
  for (int64_t i = 0; i < n * E; ++i) cost[i] = std::exp(logits[i]);
  const T eps = T(1e-8);
  std::vector<T> d1_old = d1;
  for (int64_t it = 0; it < sp.max_sinkhorn_iters; ++it) {
    for (int64_t t = 0; t < n; ++t) {
      T s = 0;
      for (int64_t e = 0; e < E; ++e) s += d1[e] * cost[t * E + e];
      d0[t] = T(1) / static_cast<T>(n) / (s + eps);
    }
    for (int64_t e = 0; e < E; ++e) {
      T s = 0;
      for (int64_t t = 0; t < n; ++t) s += d0[t] * cost[t * E + e];
      d1[e] = T(1) / static_cast<T>(E) / (s + eps);
    }
    T err = 0;
    for (int64_t e = 0; e < E; ++e) err += std::abs(d1_old[e] - d1[e]);
    d1_old = d1;
    if (err / static_cast<T>(E) <= static_cast<T>(sp.sinkhorn_tol)) break;
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e) cost[t * E + e] *= d1[e] * d0[t];
  return cost;
}

// The aux scores of one token (softmax, or sigmoid normalised over all experts); returns the
// logsumexp of the logits (the z-loss term) and, for sigmoid, the raw sigmoids in `s`.
template <class T>
T aux_scores(const T* l, const Spec& sp, T* a, T* s) {
  const int64_t E = sp.num_experts;
  if (sp.score == Spec::Score::Softmax) return softmax_row(l, E, a);
  T z = 0;
  for (int64_t e = 0; e < E; ++e) z += (s[e] = sigmoid(l[e]));
  z += T(1e-20);
  for (int64_t e = 0; e < E; ++e) a[e] = s[e] / z;
  std::vector<T> tmp(static_cast<size_t>(E));
  return softmax_row(l, E, tmp.data());
}

}  // namespace

template <class T>
void moe_route(const T* logits, const float* bias, const Spec& sp, int64_t n, T* probs, int32_t* selected) {
  const int64_t E = sp.num_experts, k = sp.topk;
  std::fill(probs, probs + n * E, T(0));
  std::fill(selected, selected + n * E, 0);
  std::vector<T> s(static_cast<size_t>(E)), r(static_cast<size_t>(E));
  std::vector<int64_t> idx;
  std::vector<T> sk;
  if (sp.sinkhorn) sk = sinkhorn(logits, n, sp);
  for (int64_t t = 0; t < n; ++t) {
    const T* l = logits + t * E;
    T* p = probs + t * E;
    if (sp.sinkhorn) {
      topk(sk.data() + t * E, E, k, nullptr, idx);
      if (k == 1) {
        for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]);
      } else {
        softmax_row(l, E, s.data());
      }
      for (int64_t e : idx) p[e] = s[e];
    } else if (sp.score == Spec::Score::Softmax) {
      if (sp.pre_softmax) {
        softmax_row(l, E, s.data());
        choose(s.data(), sp, idx);
        for (int64_t e : idx) p[e] = s[e];
      } else {
        choose(l, sp, idx);
        T m = -std::numeric_limits<T>::infinity(), sum = 0;
        for (int64_t e : idx) m = std::max(m, l[e]);
        for (int64_t e : idx) sum += (p[e] = std::exp(l[e] - m));
        for (int64_t e : idx) p[e] /= sum;
      }
    } else {
      for (int64_t e = 0; e < E; ++e) {
        s[e] = sigmoid(l[e]);
        r[e] = bias ? s[e] + static_cast<T>(bias[e]) : s[e];
      }
      choose(r.data(), sp, idx);
      T z = 0;
      for (int64_t e : idx) z += s[e];
      for (int64_t e : idx) p[e] = k > 1 ? s[e] / (z + T(1e-20)) : s[e];
    }
    for (int64_t e : idx) {
      selected[t * E + e] = 1;
      if (sp.scaling > 0) p[e] *= static_cast<T>(sp.scaling);
    }
  }
}

template <class T>
void moe_route_backward(const T* logits, const int32_t* selected, const T* dprobs, const Spec& sp, int64_t n,
                        T* dlogits) {
  const int64_t E = sp.num_experts, k = sp.topk;
  const T scale = sp.scaling > 0 ? static_cast<T>(sp.scaling) : T(1);
  std::vector<T> a(static_cast<size_t>(E)), g(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const T* l = logits + t * E;
    const int32_t* sel = selected + t * E;
    T* dl = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) g[e] = sel[e] ? dprobs[t * E + e] * scale : T(0);
    const bool sigmoid_act = sp.sinkhorn ? k == 1 : sp.score == Spec::Score::Sigmoid;
    const bool softmax_all = sp.sinkhorn ? k > 1 : sp.score == Spec::Score::Softmax && sp.pre_softmax;
    if (softmax_all) {
      softmax_row(l, E, a.data());
      T dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += a[e] * g[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = a[e] * (g[e] - dot);
    } else if (!sigmoid_act) {  // softmax over the selected logits
      T m = -std::numeric_limits<T>::infinity(), sum = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e)
        if (sel[e]) m = std::max(m, l[e]);
      for (int64_t e = 0; e < E; ++e) a[e] = sel[e] ? std::exp(l[e] - m) : T(0);
      for (int64_t e = 0; e < E; ++e) sum += a[e];
      for (int64_t e = 0; e < E; ++e) dot += (a[e] /= sum) * g[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = sel[e] ? a[e] * (g[e] - dot) : T(0);
    } else {
      T z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) a[e] = sigmoid(l[e]);
      const bool normalised = !sp.sinkhorn && k > 1;
      for (int64_t e = 0; e < E; ++e)
        if (sel[e]) z += a[e], dot += g[e] * a[e];
      z += T(1e-20);
      for (int64_t e = 0; e < E; ++e) {
        if (!sel[e]) {
          dl[e] = 0;
          continue;
        }
        const T ds = normalised ? g[e] / z - dot / (z * z) : g[e];
        dl[e] = ds * a[e] * (T(1) - a[e]);
      }
    }
  }
}

template <class T>
void moe_aux_stats(const T* logits, const Spec& sp, int64_t n, int64_t B, T* score_sums, T* counts, T* z_sum) {
  const int64_t E = sp.num_experts;
  std::fill(score_sums, score_sums + B * E, T(0));
  std::fill(counts, counts + B * E, T(0));
  std::vector<T> a(static_cast<size_t>(E)), s(static_cast<size_t>(E));
  std::vector<int64_t> idx;
  T z = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t b = t % B;
    const T lse = aux_scores(logits + t * E, sp, a.data(), s.data());
    z += lse * lse;
    for (int64_t e = 0; e < E; ++e) score_sums[b * E + e] += a[e];
    topk(a.data(), E, sp.topk, nullptr, idx);
    for (int64_t e : idx) counts[b * E + e] += T(1);
  }
  *z_sum = z;
}

template <class T>
void moe_aux_backward(const T* logits, const Spec& sp, int64_t n, int64_t B, const T* coef, T z_coef, T* dlogits) {
  const int64_t E = sp.num_experts;
  std::vector<T> a(static_cast<size_t>(E)), s(static_cast<size_t>(E)), p(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const T* l = logits + t * E;
    const T* g = coef + (t % B) * E;
    T* dl = dlogits + t * E;
    aux_scores(l, sp, a.data(), s.data());
    if (sp.score == Spec::Score::Softmax) {
      T dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += a[e] * g[e];
      for (int64_t e = 0; e < E; ++e) dl[e] += a[e] * (g[e] - dot);
    } else {
      T z = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) z += s[e], dot += g[e] * s[e];
      z += T(1e-20);
      for (int64_t e = 0; e < E; ++e) dl[e] += (g[e] / z - dot / (z * z)) * s[e] * (T(1) - s[e]);
    }
    if (z_coef != T(0)) {
      const T lse = softmax_row(l, E, p.data());
      for (int64_t e = 0; e < E; ++e) dl[e] += z_coef * T(2) * lse * p[e];
    }
  }
}

void moe_capacity(float* probs, const int32_t* selected, int64_t n, int64_t E, int64_t capacity, bool by_position,
                  bool pad, int32_t* map) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t e = 0; e < E; ++e) {
    // The expert's candidates in keep order: selected ones first (by prob, or by position), then,
    // for padding, the others; ties to the lower token.
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      const int32_t sx = selected[x * E + e], sy = selected[y * E + e];
      if (by_position) return sx > sy;
      const float px = sx ? probs[x * E + e] : 0.f, py = sy ? probs[y * E + e] : 0.f;
      return px > py;
    });
    const int64_t keep = std::min(capacity, n);
    for (int64_t t = 0; t < n; ++t) map[t * E + e] = 0;
    for (int64_t i = 0; i < keep; ++i) {
      const int64_t t = order[i];
      map[t * E + e] = pad || selected[t * E + e] ? 1 : 0;
    }
    for (int64_t t = 0; t < n; ++t)
      if (!map[t * E + e] || !selected[t * E + e]) probs[t * E + e] = 0.f;
  }
}

void moe_dispatch_plan(const int32_t* map, int64_t n, int64_t E, int32_t* token_rows, int32_t* counts) {
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t c = 0;
    for (int64_t t = 0; t < n; ++t) {
      if (map[t * E + e]) {
        token_rows[t * E + e] = static_cast<int32_t>(row++);
        ++c;
      } else {
        token_rows[t * E + e] = -1;
      }
    }
    counts[e] = static_cast<int32_t>(c);
  }
}

#define MT_INSTANTIATE(T)                                                                                         \
  template void moe_route<T>(const T*, const float*, const Spec&, int64_t, T*, int32_t*);                         \
  template void moe_route_backward<T>(const T*, const int32_t*, const T*, const Spec&, int64_t, T*);              \
  template void moe_aux_stats<T>(const T*, const Spec&, int64_t, int64_t, T*, T*, T*);                            \
  template void moe_aux_backward<T>(const T*, const Spec&, int64_t, int64_t, const T*, T, T*);
MT_INSTANTIATE(float)
MT_INSTANTIATE(double)
#undef MT_INSTANTIATE

}  // namespace mt::cpu
