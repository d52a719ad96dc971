// Mixture-of-experts routing on the GPU: the router ops of ops.def (moe_route and its backward,
// the load-balancing statistics and their gradient, token dropping, the dispatch plan) with the
// rules of kernels/moe_routing.h. They choose what the CPU reference (kernels/cpu/
// moe_routing.cpp) chooses: the same experts per token (ties to the lower index), the same kept
// tokens, the same expert-major dispatch rows; values agree within fp32 rounding (sums run in
// other, fixed, orders). E is small: a warp per token, lane i holding experts i, i + 32, ...
// No float atomics and no host synchronisation anywhere.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

using Spec = ops::RouterSpec;
constexpr unsigned kFull = 0xffffffffu;
// A lane's set of chosen experts is one uint64_t (bit j: expert lane + 32 j).
constexpr int64_t kMaxExperts = 32 * 64;
constexpr int kMaxWarps = 4;          // tokens per block in the warp-per-token kernels
constexpr size_t kSmemBudget = 48 << 10;  // dynamic shared memory per block without opting in

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ float sigmoid_(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ bool has_bit(uint64_t m, int64_t j) { return (m >> j) & 1u; }

// Softmax of a row over the warp: the row's max and sum of exp(x - max), every lane holding the
// same values (butterfly reductions). p() and lse() are the CPU's formulas.
struct RowSoftmax {
  float m, sum;
  __device__ float p(float x) const { return expf(x - m) / sum; }
  __device__ float lse() const { return m + logf(sum); }
};
__device__ RowSoftmax warp_softmax(const float* l, int64_t E) {
  float m = -INFINITY, s = 0.f;
  for (int64_t e = lane_id(); e < E; e += 32) m = fmaxf(m, l[e]);
  m = warp_max(m);
  for (int64_t e = lane_id(); e < E; e += 32) s += expf(l[e] - m);
  return {m, warp_sum(s)};
}

// k rounds of a warp-wide argmax over v[0:n) among the indices where ok(i), ties to the lower
// index (the CPU's topk): calls pick(i) on every lane for each choice, in choice order (largest
// first), and returns this lane's chosen set (bit j: index lane + 32 j; n <= kMaxExperts). The
// caller makes sure at least k indices pass `ok`.
template <typename Ok, typename Pick>
__device__ uint64_t warp_topk(const float* v, int64_t n, int64_t k, Ok ok, Pick pick) {
  const int lane = lane_id();
  uint64_t mine = 0;
  for (int64_t r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = -1;
    int j = 0;
    for (int64_t i = lane; i < n; i += 32, ++j) {
      if (has_bit(mine, j) || !ok(i)) continue;
      if (bi < 0 || v[i] > bv) bv = v[i], bi = static_cast<int>(i);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kFull, bv, o);
      const int oi = __shfl_xor_sync(kFull, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
    }
    bi = __shfl_sync(kFull, bi, 0);  // one answer even if a NaN made the order partial
    if ((bi & 31) == lane) mine |= uint64_t{1} << (bi >> 5);
    pick(static_cast<int64_t>(bi));
  }
  return mine;
}
struct AnyIndex {
  __device__ bool operator()(int64_t) const { return true; }
};
struct NoPick {
  __device__ void operator()(int64_t) const {}
};

// ---- moe_route: a warp per token. Shared memory per warp: v[E] (what the choice ranks), s[E]
// (what the weights come from), and for group-limited routing gscore[G] and gallowed[G].
size_t route_warp_floats(const Spec& sp) { return static_cast<size_t>(2 * sp.num_experts + 2 * sp.num_groups); }

// Sinkhorn's scores, when given: cost [E, n] (exp(logits), transposed) and the scales d0 [n], d1 [E].
struct SinkhornScores {
  const float* cost = nullptr;
  const float* d0 = nullptr;
  const float* d1 = nullptr;
};

__global__ void route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, Spec sp, int64_t n,
                             SinkhornScores sk, float* __restrict__ probs, int32_t* __restrict__ selected) {
  extern __shared__ float route_sh[];
  const int64_t E = sp.num_experts, G = sp.num_groups, k = sp.topk;
  const int warp = threadIdx.x >> 5, lane = lane_id();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (t >= n) return;  // whole warps: nothing below syncs the block
  float* v = route_sh + warp * (2 * E + 2 * G);
  float* s = v + E;
  float* gscore = s + E;
  int* gallowed = reinterpret_cast<int*>(gscore + G);
  const float* l = logits + t * E;
  const bool softmax = sp.score == Spec::Score::Softmax;

  if (sp.sinkhorn) {
    const float d0 = sk.d0[t];
    for (int64_t e = lane; e < E; e += 32) v[e] = sk.cost[e * n + t] * (sk.d1[e] * d0);
    if (k == 1) {
      for (int64_t e = lane; e < E; e += 32) s[e] = sigmoid_(l[e]);
    } else {
      const RowSoftmax r = warp_softmax(l, E);
      for (int64_t e = lane; e < E; e += 32) s[e] = r.p(l[e]);
    }
  } else if (softmax && sp.pre_softmax) {
    const RowSoftmax r = warp_softmax(l, E);
    for (int64_t e = lane; e < E; e += 32) s[e] = v[e] = r.p(l[e]);
  } else if (softmax) {
    for (int64_t e = lane; e < E; e += 32) v[e] = l[e];
  } else {
    for (int64_t e = lane; e < E; e += 32) {
      s[e] = sigmoid_(l[e]);
      v[e] = bias ? s[e] + bias[e] : s[e];
    }
  }
  __syncwarp();

  uint64_t mine;
  if (G > 0 && !sp.sinkhorn) {  // group-limited: the best group_topk groups, then the top-k in them
    const int64_t gs = E / G, per = k / sp.group_topk;
    for (int64_t g = 0; g < G; ++g) {
      float sum = 0.f;  // the group's top-per values, summed in choice order as the CPU does
      warp_topk(v + g * gs, gs, per, AnyIndex{}, [&](int64_t i) { sum += v[g * gs + i]; });
      if (lane == 0) gscore[g] = sum, gallowed[g] = 0;
    }
    __syncwarp();
    warp_topk(gscore, G, sp.group_topk, AnyIndex{}, [&](int64_t g) {
      if (lane == 0) gallowed[g] = 1;
    });
    __syncwarp();
    mine = warp_topk(v, E, k, [&](int64_t i) { return gallowed[i / gs] != 0; }, NoPick{});
  } else {
    mine = warp_topk(v, E, k, AnyIndex{}, NoPick{});
  }

  // The weights of the chosen experts.
  const bool from_s = sp.sinkhorn || (softmax && sp.pre_softmax);
  float m = -INFINITY, z = 0.f;
  if (!from_s && softmax) {  // softmax over the chosen logits
    int j = 0;
    for (int64_t e = lane; e < E; e += 32, ++j)
      if (has_bit(mine, j)) m = fmaxf(m, l[e]);
    m = warp_max(m);
    j = 0;
    for (int64_t e = lane; e < E; e += 32, ++j)
      if (has_bit(mine, j)) z += expf(l[e] - m);
    z = warp_sum(z);
  } else if (!from_s) {  // sigmoid: normalised over the chosen when k > 1
    int j = 0;
    for (int64_t e = lane; e < E; e += 32, ++j)
      if (has_bit(mine, j)) z += s[e];
    z = warp_sum(z);
  }
  int j = 0;
  for (int64_t e = lane; e < E; e += 32, ++j) {
    const bool chosen = has_bit(mine, j);
    float p = 0.f;
    if (chosen) {
      if (from_s) p = s[e];
      else if (softmax) p = expf(l[e] - m) / z;
      else p = k > 1 ? s[e] / (z + 1e-20f) : s[e];
      if (sp.scaling > 0) p *= sp.scaling;
    }
    probs[t * E + e] = p;
    selected[t * E + e] = chosen ? 1 : 0;
  }
}

// Sinkhorn (Megatron's sinkhorn, the CPU's loop): one block of kSinkThreads runs every round,
// with the convergence test on the device. cost [E, n] = exp(logits) transposed, so that the
// row pass (a thread per token, experts ascending: the CPU's order) and the column pass (warps
// over fixed slices of a column, then the slices in order) both read it coalesced. Shared
// memory: d1[E], d1_old[E], slice sums[max(E, 32)].
constexpr int kSinkThreads = 1024;
__global__ void __launch_bounds__(kSinkThreads)
    sinkhorn_kernel(const float* __restrict__ logits, int64_t n, int64_t E, float tol, int64_t max_iters,
                    float* __restrict__ cost, float* __restrict__ d0, float* __restrict__ d1_out) {
  extern __shared__ float sink_sh[];
  float* d1 = sink_sh;
  float* d1_old = d1 + E;
  float* slice = d1_old + E;
  __shared__ int done;
  const int tid = threadIdx.x, lane = lane_id(), warp = tid >> 5, nw = kSinkThreads / 32;
  for (int64_t i = tid; i < n * E; i += kSinkThreads) cost[(i % E) * n + i / E] = expf(logits[i]);
  for (int64_t t = tid; t < n; t += kSinkThreads) d0[t] = 1.f;  // the scales before any round
  for (int64_t e = tid; e < E; e += kSinkThreads) d1[e] = d1_old[e] = 1.f;
  // Each column in `parts` fixed slices (more warps per column when there are few columns).
  const int64_t parts = E < nw ? nw / E : 1, chunk = (n + parts - 1) / parts;
  const float eps = 1e-8f, inv_n = 1.f / static_cast<float>(n), inv_e = 1.f / static_cast<float>(E);
  __syncthreads();
  for (int64_t it = 0; it < max_iters; ++it) {
    for (int64_t t = tid; t < n; t += kSinkThreads) {
      float s = 0.f;
      for (int64_t e = 0; e < E; ++e) s += d1[e] * cost[e * n + t];
      d0[t] = inv_n / (s + eps);
    }
    __syncthreads();
    for (int64_t u = warp; u < E * parts; u += nw) {
      const int64_t e = u / parts, lo = (u % parts) * chunk, hi = min(n, lo + chunk);
      float s = 0.f;
      for (int64_t t = lo + lane; t < hi; t += 32) s += d0[t] * cost[e * n + t];
      s = warp_sum(s);
      if (lane == 0) slice[u] = s;
    }
    __syncthreads();
    for (int64_t e = tid; e < E; e += kSinkThreads) {
      float s = 0.f;
      for (int64_t p = 0; p < parts; ++p) s += slice[e * parts + p];
      d1[e] = inv_e / (s + eps);
    }
    __syncthreads();
    if (warp == 0) {
      float err = 0.f;
      for (int64_t e = lane; e < E; e += 32) {
        err += fabsf(d1_old[e] - d1[e]);
        d1_old[e] = d1[e];
      }
      err = warp_sum(err);
      if (lane == 0) done = err / static_cast<float>(E) <= tol;
    }
    __syncthreads();
    if (done) break;
  }
  for (int64_t e = tid; e < E; e += kSinkThreads) d1_out[e] = d1[e];
}

// ---- moe_route_backward: a warp per token, the CPU's three cases.
__global__ void route_backward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ selected,
                                      const float* __restrict__ dprobs, Spec sp, int64_t n,
                                      float* __restrict__ dlogits) {
  const int64_t E = sp.num_experts, k = sp.topk;
  const int lane = lane_id();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= n) return;
  const float* l = logits + t * E;
  const int32_t* sel = selected + t * E;
  const float* dp = dprobs + t * E;
  float* dl = dlogits + t * E;
  const float scale = sp.scaling > 0 ? sp.scaling : 1.f;
  auto g = [&](int64_t e) { return sel[e] ? dp[e] * scale : 0.f; };
  const bool sigmoid_act = sp.sinkhorn ? k == 1 : sp.score == Spec::Score::Sigmoid;
  const bool softmax_all = sp.sinkhorn ? k > 1 : sp.score == Spec::Score::Softmax && sp.pre_softmax;
  if (softmax_all) {
    const RowSoftmax r = warp_softmax(l, E);
    float dot = 0.f;
    for (int64_t e = lane; e < E; e += 32) dot += r.p(l[e]) * g(e);
    dot = warp_sum(dot);
    for (int64_t e = lane; e < E; e += 32) dl[e] = r.p(l[e]) * (g(e) - dot);
  } else if (!sigmoid_act) {  // softmax over the selected logits
    float m = -INFINITY, sum = 0.f, dot = 0.f;
    for (int64_t e = lane; e < E; e += 32)
      if (sel[e]) m = fmaxf(m, l[e]);
    m = warp_max(m);
    for (int64_t e = lane; e < E; e += 32)
      if (sel[e]) sum += expf(l[e] - m);
    sum = warp_sum(sum);
    for (int64_t e = lane; e < E; e += 32)
      if (sel[e]) dot += expf(l[e] - m) / sum * g(e);
    dot = warp_sum(dot);
    for (int64_t e = lane; e < E; e += 32) dl[e] = sel[e] ? expf(l[e] - m) / sum * (g(e) - dot) : 0.f;
  } else {
    const bool normalised = !sp.sinkhorn && k > 1;
    float z = 0.f, dot = 0.f;
    for (int64_t e = lane; e < E; e += 32)
      if (sel[e]) {
        const float a = sigmoid_(l[e]);
        z += a, dot += g(e) * a;
      }
    z = warp_sum(z) + 1e-20f;
    dot = warp_sum(dot);
    for (int64_t e = lane; e < E; e += 32) {
      if (!sel[e]) {
        dl[e] = 0.f;
        continue;
      }
      const float a = sigmoid_(l[e]);
      const float ds = normalised ? g(e) / z - dot / (z * z) : g(e);
      dl[e] = ds * a * (1.f - a);
    }
  }
}

// ---- Load-balancing statistics. The aux scores of one token into a[E] (softmax, or sigmoid
// normalised over all experts; each lane writes its own experts); returns logsumexp(logits).
__device__ float aux_scores(const float* l, const Spec& sp, float* a) {
  const int64_t E = sp.num_experts;
  const RowSoftmax r = warp_softmax(l, E);
  if (sp.score == Spec::Score::Softmax) {
    for (int64_t e = lane_id(); e < E; e += 32) a[e] = r.p(l[e]);
  } else {
    float z = 0.f;
    for (int64_t e = lane_id(); e < E; e += 32) z += (a[e] = sigmoid_(l[e]));
    z = warp_sum(z) + 1e-20f;
    for (int64_t e = lane_id(); e < E; e += 32) a[e] /= z;
  }
  return r.lse();
}

// Grid (chunks, B): block (c, b) takes sequence b's positions [c * kAuxPositions, ...), its warps
// taking them in turn, each warp summing into its own shared rows (a[E], sums[E], counts[E]);
// then the warps' rows are added in warp order into the block's partial row q = b * chunks + c,
// and the warps' z-loss sums into part_z[q]. aux_finish_kernel adds the partial rows in order.
constexpr int64_t kAuxPositions = 32;
__global__ void aux_stats_kernel(const float* __restrict__ logits, Spec sp, int64_t S, int64_t B,
                                 float* __restrict__ part_sums, float* __restrict__ part_counts,
                                 float* __restrict__ part_z) {
  extern __shared__ float aux_sh[];
  __shared__ float warp_z[32];
  const int64_t E = sp.num_experts;
  const int warp = threadIdx.x >> 5, lane = lane_id(), nw = blockDim.x >> 5;
  float* a = aux_sh + warp * 3 * E;
  float* sums = a + E;
  float* counts = sums + E;
  for (int64_t e = lane; e < E; e += 32) sums[e] = counts[e] = 0.f;
  const int64_t b = blockIdx.y, c = blockIdx.x;
  const int64_t end = min(S, (c + 1) * kAuxPositions);
  float z = 0.f;
  for (int64_t pos = c * kAuxPositions + warp; pos < end; pos += nw) {
    const float lse = aux_scores(logits + (pos * B + b) * E, sp, a);
    z += lse * lse;
    for (int64_t e = lane; e < E; e += 32) sums[e] += a[e];
    __syncwarp();
    warp_topk(a, E, sp.topk, AnyIndex{}, [&](int64_t i) {
      if ((i & 31) == lane) counts[i] += 1.f;  // the lane that owns expert i
    });
    __syncwarp();  // before the next token overwrites a
  }
  if (lane == 0) warp_z[warp] = z;
  __syncthreads();
  const int64_t q = b * gridDim.x + c;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    float s = 0.f, n = 0.f;
    for (int w = 0; w < nw; ++w) s += aux_sh[w * 3 * E + E + e], n += aux_sh[w * 3 * E + 2 * E + e];
    part_sums[q * E + e] = s;
    part_counts[q * E + e] = n;
  }
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < nw; ++w) s += warp_z[w];
    part_z[q] = s;
  }
}

__global__ void aux_finish_kernel(const float* __restrict__ part_sums, const float* __restrict__ part_counts,
                                  const float* __restrict__ part_z, int64_t chunks, int64_t B, int64_t E,
                                  float* __restrict__ sums, float* __restrict__ counts, float* __restrict__ z_sum) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = i0; i < B * E; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / E, e = i % E;
    float s = 0.f, n = 0.f;
    for (int64_t c = 0; c < chunks; ++c) {
      s += part_sums[(b * chunks + c) * E + e];
      n += part_counts[(b * chunks + c) * E + e];
    }
    sums[i] = s;
    counts[i] = n;
  }
  if (i0 == 0) {
    float z = 0.f;
    for (int64_t q = 0; q < B * chunks; ++q) z += part_z[q];
    *z_sum = z;
  }
}

// ---- moe_aux_backward: a warp per token, dlogits += the aux gradient, then the z-loss's.
__global__ void aux_backward_kernel(const float* __restrict__ logits, Spec sp, int64_t n, int64_t B,
                                    const float* __restrict__ coef, float z_coef, float* __restrict__ dlogits) {
  const int64_t E = sp.num_experts;
  const int lane = lane_id();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= n) return;
  const float* l = logits + t * E;
  const float* g = coef + (t % B) * E;
  float* dl = dlogits + t * E;
  const RowSoftmax r = warp_softmax(l, E);
  const float lse = r.lse();
  if (sp.score == Spec::Score::Softmax) {
    float dot = 0.f;
    for (int64_t e = lane; e < E; e += 32) dot += r.p(l[e]) * g[e];
    dot = warp_sum(dot);
    for (int64_t e = lane; e < E; e += 32) {
      const float a = r.p(l[e]);
      float d = dl[e] + a * (g[e] - dot);
      if (z_coef != 0.f) d += z_coef * 2.f * lse * a;
      dl[e] = d;
    }
  } else {
    float z = 0.f, dot = 0.f;
    for (int64_t e = lane; e < E; e += 32) {
      const float s = sigmoid_(l[e]);
      z += s, dot += g[e] * s;
    }
    z = warp_sum(z) + 1e-20f;
    dot = warp_sum(dot);
    for (int64_t e = lane; e < E; e += 32) {
      const float s = sigmoid_(l[e]);
      float d = dl[e] + (g[e] / z - dot / (z * z)) * s * (1.f - s);
      if (z_coef != 0.f) d += z_coef * 2.f * lse * r.p(l[e]);
      dl[e] = d;
    }
  }
}

// ---- moe_capacity: a block per expert. Each token has a distinct 64-bit key whose descending
// order is the CPU's keep order (high half: 1 for selected, or the selected prob's order-
// preserving bits, 0 for unselected; low half: ~t, so equal priorities go to the lower token).
// A radix select (8 bits a pass, shared int histograms) finds the keep-th largest key; a token
// is kept iff its key is at least that.
__device__ __forceinline__ uint64_t capacity_key(const float* probs, const int32_t* sel, int64_t t, int64_t E,
                                                 int64_t e, bool by_position) {
  const bool s = sel[t * E + e] != 0;
  uint32_t hi;
  if (by_position) {
    hi = s ? 1u : 0u;
  } else {
    float p = s ? probs[t * E + e] : 0.f;
    if (p == 0.f) p = 0.f;  // -0 ranks as +0, as the CPU's comparison has it
    const uint32_t bits = __float_as_uint(p);
    hi = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  }
  return (static_cast<uint64_t>(hi) << 32) | (0xffffffffu - static_cast<uint32_t>(t));
}

constexpr int kCapacityThreads = 1024;
__global__ void __launch_bounds__(kCapacityThreads)
    capacity_kernel(float* __restrict__ probs, const int32_t* __restrict__ sel, int32_t* __restrict__ map, int64_t n,
                    int64_t E, int64_t keep, bool by_position, bool pad) {
  __shared__ unsigned hist[256];
  __shared__ uint64_t prefix_sh;
  __shared__ int64_t remaining_sh;
  const int64_t e = blockIdx.x;
  uint64_t prefix = 0, mask = 0;
  int64_t remaining = keep;
  for (int shift = 56; keep > 0 && shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
      const uint64_t key = capacity_key(probs, sel, t, E, e, by_position);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = 255;
      for (; d > 0 && static_cast<int64_t>(hist[d]) < remaining; --d) remaining -= hist[d];
      prefix_sh = prefix | (static_cast<uint64_t>(d) << shift);
      remaining_sh = remaining;
    }
    __syncthreads();
    prefix = prefix_sh;
    remaining = remaining_sh;
    mask |= uint64_t{255} << shift;
  }
  // prefix is now the keep-th largest key.
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    const bool kept = keep > 0 && capacity_key(probs, sel, t, E, e, by_position) >= prefix;
    const bool s = sel[t * E + e] != 0;
    const bool m = kept && (pad || s);
    map[t * E + e] = m ? 1 : 0;
    if (!m || !s) probs[t * E + e] = 0.f;
  }
}

// ---- moe_dispatch_plan, deterministic by construction: tokens in chunks of kPlanChunk (a
// block each, a thread per token). 1) each chunk's count per expert; 2) one block turns them
// into each chunk's first row per expert (experts' bases, then the chunks before it, in order)
// and writes counts; 3) each token's row = its chunk's first row + its rank within the chunk.
constexpr int kPlanChunk = 256;
__global__ void __launch_bounds__(kPlanChunk)
    plan_count_kernel(const int32_t* __restrict__ map, int64_t n, int64_t E, int32_t* __restrict__ chunk_rows) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kPlanChunk + threadIdx.x;
  for (int64_t e = 0; e < E; ++e) {
    const int c = __syncthreads_count(t < n && map[t * E + e] != 0);
    if (threadIdx.x == 0) chunk_rows[blockIdx.x * E + e] = c;
  }
}
__global__ void plan_scan_kernel(int32_t* __restrict__ chunk_rows, int64_t chunks, int64_t E,
                                 int32_t* __restrict__ counts) {
  extern __shared__ int32_t plan_base[];  // [E]
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += chunk_rows[c * E + e];
    counts[e] = total;
    plan_base[e] = total;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t row = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t c = plan_base[e];
      plan_base[e] = row;
      row += c;
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t row = plan_base[e];
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t cnt = chunk_rows[c * E + e];
      chunk_rows[c * E + e] = row;
      row += cnt;
    }
  }
}
__global__ void __launch_bounds__(kPlanChunk)
    plan_rows_kernel(const int32_t* __restrict__ map, const int32_t* __restrict__ chunk_rows, int64_t n, int64_t E,
                     int32_t* __restrict__ token_rows) {
  __shared__ int32_t warp_count[kPlanChunk / 32];
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kPlanChunk + threadIdx.x;
  const int lane = lane_id(), warp = threadIdx.x >> 5;
  for (int64_t e = 0; e < E; ++e) {
    const bool on = t < n && map[t * E + e] != 0;
    const unsigned bits = __ballot_sync(kFull, on);
    if (lane == 0) warp_count[warp] = __popc(bits);
    __syncthreads();
    int32_t rank = __popc(bits & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) rank += warp_count[w];
    if (t < n) token_rows[t * E + e] = on ? chunk_rows[blockIdx.x * E + e] + rank : -1;
    __syncthreads();  // before warp_count is rewritten
  }
}

// ---- Launchers.
void check_spec(const Spec& sp, int64_t E) {
  MT_CHECK(sp.num_experts == E, "moe router: logits of {} experts, spec {}", E, sp.num_experts);
  MT_CHECK(E >= 1 && E <= kMaxExperts, "moe router: {} experts (the GPU kernels take 1 to {})", E, kMaxExperts);
  MT_CHECK(sp.topk >= 1 && sp.topk <= E, "moe router: top-{} of {} experts", sp.topk, E);
  if (sp.num_groups > 0)
    MT_CHECK(E % sp.num_groups == 0 && sp.group_topk >= 1 && sp.group_topk <= sp.num_groups &&
                 sp.topk % sp.group_topk == 0 && sp.topk / sp.group_topk <= E / sp.num_groups,
             "moe router: top-{} in {} of {} groups of {} experts", sp.topk, sp.group_topk, sp.num_groups, E);
}

// Warps per block for a warp-per-token kernel that needs `warp_bytes` of shared memory per warp.
int warps_for(size_t warp_bytes) {
  return static_cast<int>(std::clamp<size_t>(kSmemBudget / std::max<size_t>(warp_bytes, 1), 1, kMaxWarps));
}
unsigned token_blocks(int64_t n, int warps) { return static_cast<unsigned>(ceil_div(n, warps)); }

void route(const float* logits, const float* bias, const Spec& sp, int64_t n, float* probs, int32_t* selected,
           cudaStream_t s) {
  const int64_t E = sp.num_experts;
  if (n == 0) return;
  // Sinkhorn's scores live until the route kernel has read them (scratch frees in stream order).
  Scratch sk_mem(sp.sinkhorn ? static_cast<size_t>(n * E + n + E) * sizeof(float) : 0, s);
  SinkhornScores sk;
  if (sp.sinkhorn) {
    float* cost = sk_mem.as<float>();
    float* d0 = cost + n * E;
    float* d1 = d0 + n;
    const size_t smem = static_cast<size_t>(2 * E + std::max<int64_t>(E, 32)) * sizeof(float);
    sinkhorn_kernel<<<1, kSinkThreads, smem, s>>>(logits, n, E, sp.sinkhorn_tol, sp.max_sinkhorn_iters, cost, d0, d1);
    MT_CUDA_LAUNCH_CHECK();
    sk = {cost, d0, d1};
  }
  const size_t warp_bytes = route_warp_floats(sp) * sizeof(float);
  MT_CHECK(warp_bytes <= kSmemBudget, "moe_route: {} experts in {} groups need too much shared memory", E,
           sp.num_groups);
  const int warps = warps_for(warp_bytes);
  route_kernel<<<token_blocks(n, warps), 32 * warps, warps * warp_bytes, s>>>(logits, bias, sp, n, sk, probs,
                                                                             selected);
  MT_CUDA_LAUNCH_CHECK();
}

void route_backward(const float* logits, const int32_t* selected, const float* dprobs, const Spec& sp, int64_t n,
                    float* dlogits, cudaStream_t s) {
  if (n == 0) return;
  route_backward_kernel<<<token_blocks(n, kMaxWarps), 32 * kMaxWarps, 0, s>>>(logits, selected, dprobs, sp, n,
                                                                             dlogits);
  MT_CUDA_LAUNCH_CHECK();
}

void aux_stats(const float* logits, const Spec& sp, int64_t n, int64_t B, float* sums, float* counts, float* z_sum,
               cudaStream_t s) {
  const int64_t E = sp.num_experts, S = n / B, chunks = std::max<int64_t>(1, ceil_div(S, kAuxPositions));
  MT_CHECK(chunks < 65536 && B < 65536, "moe_aux_stats: {} positions x {} sequences exceed the grid", S, B);
  const size_t warp_bytes = static_cast<size_t>(3 * E) * sizeof(float);
  const int warps = warps_for(warp_bytes);
  Scratch part(static_cast<size_t>(B * chunks * (2 * E + 1)) * sizeof(float), s);
  float* part_sums = part.as<float>();
  float* part_counts = part_sums + B * chunks * E;
  float* part_z = part_counts + B * chunks * E;
  aux_stats_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(B)), 32 * warps, warps * warp_bytes,
                     s>>>(logits, sp, S, B, part_sums, part_counts, part_z);
  MT_CUDA_LAUNCH_CHECK();
  aux_finish_kernel<<<grid_for(B * E, 256, 1024), 256, 0, s>>>(part_sums, part_counts, part_z, chunks, B, E, sums,
                                                               counts, z_sum);
  MT_CUDA_LAUNCH_CHECK();
}

void aux_backward(const float* logits, const Spec& sp, int64_t n, int64_t B, const float* coef, float z_coef,
                  float* dlogits, cudaStream_t s) {
  if (n == 0) return;
  aux_backward_kernel<<<token_blocks(n, kMaxWarps), 32 * kMaxWarps, 0, s>>>(logits, sp, n, B, coef, z_coef, dlogits);
  MT_CUDA_LAUNCH_CHECK();
}

void capacity(float* probs, const int32_t* selected, int32_t* map, int64_t n, int64_t E, int64_t capacity,
              bool by_position, bool pad, cudaStream_t s) {
  if (n == 0 || E == 0) return;
  MT_CHECK(n < (int64_t{1} << 31), "moe_capacity: {} tokens exceed the int32 index range", n);
  capacity_kernel<<<static_cast<unsigned>(E), kCapacityThreads, 0, s>>>(probs, selected, map, n, E,
                                                                        std::min(capacity, n), by_position, pad);
  MT_CUDA_LAUNCH_CHECK();
}

void dispatch_plan(const int32_t* map, int64_t n, int64_t E, int32_t* token_rows, int32_t* counts, cudaStream_t s) {
  if (E == 0) return;
  MT_CHECK(n * E < (int64_t{1} << 31), "moe_dispatch_plan: {} tokens x {} experts exceed the int32 row range", n, E);
  if (n == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(E) * sizeof(int32_t), s));
    return;
  }
  const int64_t chunks = ceil_div(n, kPlanChunk);
  Scratch chunk_mem(static_cast<size_t>(chunks * E) * sizeof(int32_t), s);
  int32_t* chunk_rows = chunk_mem.as<int32_t>();
  plan_count_kernel<<<static_cast<unsigned>(chunks), kPlanChunk, 0, s>>>(map, n, E, chunk_rows);
  MT_CUDA_LAUNCH_CHECK();
  plan_scan_kernel<<<1, 256, static_cast<size_t>(E) * sizeof(int32_t), s>>>(chunk_rows, chunks, E, counts);
  MT_CUDA_LAUNCH_CHECK();
  plan_rows_kernel<<<static_cast<unsigned>(chunks), kPlanChunk, 0, s>>>(map, chunk_rows, n, E, token_rows);
  MT_CUDA_LAUNCH_CHECK();
}

// One block: thread 0 sums the counts in expert order (fp64, as the CPU), then every expert's
// bias takes its step.
__global__ void expert_bias_update_kernel(float* bias, const float* counts, int E, float rate) {
  __shared__ double mean;
  if (threadIdx.x == 0) {
    double s = 0;
    for (int e = 0; e < E; ++e) s += counts[e];
    mean = s / E;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const double off = mean - counts[e];
    bias[e] += static_cast<float>((off > 0) - (off < 0)) * rate;
  }
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {
namespace {

using cuda::compute_stream;

// A router tensor [n, E] (2-D, on the GPU, of dtype d).
template <typename T>
T* router_data(const Tensor& t, DType d, int64_t n, int64_t E, const char* what) {
  MT_CHECK(t.ndim() == 2, "{}: expected [tokens, experts], got {}", what, t.shape_str());
  return cuda_data<T>(t, d, n * E, what);
}

// The router's logits [n, E], checked against the spec (and, with B > 0, whole sequences of a
// batch of B).
struct Logits {
  const float* data;
  int64_t n, E;
};
Logits router_logits(const Tensor& logits, const RouterSpec& spec, const char* what, int64_t B = 0) {
  MT_CHECK(logits.ndim() == 2, "{}: logits {} are not [tokens, experts]", what, logits.shape_str());
  const int64_t n = logits.dim(0), E = logits.dim(1);
  cuda::check_spec(spec, E);
  MT_CHECK(B == 0 || (B >= 1 && n % B == 0), "{}: {} tokens are not whole sequences of a batch of {}", what, n, B);
  return {router_data<float>(logits, DType::F32, n, E, what), n, E};
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor* expert_bias, const RouterSpec& spec, Tensor& probs,
               Tensor& selected) {
  const auto [l, n, E] = router_logits(logits, spec, "moe_route");
  const float* bias =
      expert_bias ? cuda_data<float>(*expert_bias, DType::F32, E, "moe_route (expert bias)") : nullptr;
  probs = Tensor::empty({n, E}, DType::F32, Device::CUDA);
  selected = Tensor::empty({n, E}, DType::I32, Device::CUDA);
  cuda::route(l, bias, spec, n, probs.data<float>(), selected.data<int32_t>(), compute_stream());
}

Tensor moe_route_backward(const Tensor& logits, const Tensor& selected, const Tensor& dprobs, const RouterSpec& spec) {
  const auto [l, n, E] = router_logits(logits, spec, "moe_route_backward");
  const int32_t* sel = router_data<int32_t>(selected, DType::I32, n, E, "moe_route_backward (selected)");
  const float* dp = router_data<float>(dprobs, DType::F32, n, E, "moe_route_backward (dprobs)");
  Tensor dl = Tensor::empty({n, E}, DType::F32, Device::CUDA);
  cuda::route_backward(l, sel, dp, spec, n, dl.data<float>(), compute_stream());
  return dl;
}

void moe_aux_stats(const Tensor& logits, const RouterSpec& spec, int64_t B, Tensor& score_sums, Tensor& counts,
                   Tensor& z_sum) {
  const auto [l, n, E] = router_logits(logits, spec, "moe_aux_stats", B);
  score_sums = Tensor::empty({B, E}, DType::F32, Device::CUDA);
  counts = Tensor::empty({B, E}, DType::F32, Device::CUDA);
  z_sum = Tensor::empty({1}, DType::F32, Device::CUDA);
  cuda::aux_stats(l, spec, n, B, score_sums.data<float>(), counts.data<float>(), z_sum.data<float>(),
                  compute_stream());
}

void moe_aux_backward(const Tensor& logits, const RouterSpec& spec, int64_t B, const Tensor& coef, float z_coef,
                      Tensor& dlogits) {
  const auto [l, n, E] = router_logits(logits, spec, "moe_aux_backward", B);
  const float* g = cuda_data<float>(coef, DType::F32, B * E, "moe_aux_backward (coef)");
  float* dl = router_data<float>(dlogits, DType::F32, n, E, "moe_aux_backward (dlogits)");
  cuda::aux_backward(l, spec, n, B, g, z_coef, dl, compute_stream());
}

void moe_expert_bias_update(Tensor& bias, const Tensor& counts, float rate) {
  const int64_t E = bias.numel();
  float* b = cuda_data<float>(bias, DType::F32, E, "moe_expert_bias_update (bias)");
  const float* c = cuda_data<float>(counts, DType::F32, E, "moe_expert_bias_update (counts)");
  cuda::expert_bias_update_kernel<<<1, 256, 0, compute_stream()>>>(b, c, static_cast<int>(E), rate);
  MT_CUDA_LAUNCH_CHECK();
}

Tensor moe_capacity(Tensor& probs, const Tensor& selected, int64_t capacity, bool by_position, bool pad_to_capacity) {
  MT_CHECK(probs.ndim() == 2, "moe_capacity: probs {} are not [tokens, experts]", probs.shape_str());
  MT_CHECK(capacity >= 0, "moe_capacity: capacity {} is negative", capacity);
  const int64_t n = probs.dim(0), E = probs.dim(1);
  float* p = router_data<float>(probs, DType::F32, n, E, "moe_capacity (probs)");
  const int32_t* sel = router_data<int32_t>(selected, DType::I32, n, E, "moe_capacity (selected)");
  Tensor map = Tensor::empty({n, E}, DType::I32, Device::CUDA);
  cuda::capacity(p, sel, map.data<int32_t>(), n, E, capacity, by_position, pad_to_capacity, compute_stream());
  return map;
}

Tensor moe_dispatch_plan(const Tensor& map, Tensor& counts) {
  MT_CHECK(map.ndim() == 2, "moe_dispatch_plan: map {} is not [tokens, experts]", map.shape_str());
  const int64_t n = map.dim(0), E = map.dim(1);
  const int32_t* m = router_data<int32_t>(map, DType::I32, n, E, "moe_dispatch_plan (map)");
  Tensor rows = Tensor::empty({n, E}, DType::I32, Device::CUDA);
  counts = Tensor::empty({E}, DType::I32, Device::CUDA);
  cuda::dispatch_plan(m, n, E, rows.data<int32_t>(), counts.data<int32_t>(), compute_stream());
  return rows;
}

}  // namespace mt::ops::gpu
