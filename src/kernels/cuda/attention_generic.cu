// Generic attention kernels: any head dim up to 256, fp32 or bf16 storage, fp32 math. One warp
// per query row (forward, dQ) or key row (dK/dV); lanes split the head dim and dot products are
// warp reductions. Slow next to the tensor-core kernels, but exact enough to test against the
// CPU at fp32 and used for head dims the tensor-core kernels do not cover, and for the chunk and
// packed-document forms of AttentionShape (query/key chunks at positions, cu_seqlens): each row
// attends to the keys ops::visible_keys gives it, as the CPU kernel does.
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"

namespace mt::cuda {

namespace {

constexpr int kWarps = 4;

struct GenArgs {
  int S, Sk, Hq, Hkv, group, D;
  float scale;
  bool causal;
  float dropout_p, keep_scale;
  uint64_t seed, offset;
  ops::AttentionShape shape;  // positions and documents (visible_keys); cu_seqlens on the device
  bool plain;                 // shape.plain(): rows see keys [0, i] (causal) or all
};

// Dropout keyed by positions in the whole sequence, as the CPU's (attention_shape.h).
__device__ __forceinline__ float gen_drop(const GenArgs& a, int64_t bh, int i, int j) {
  const uint64_t T = static_cast<uint64_t>(a.shape.total());
  const uint64_t idx = (static_cast<uint64_t>(bh) * T + static_cast<uint64_t>(a.shape.q_pos + i)) * T +
                       static_cast<uint64_t>(a.shape.k_pos + j);
  return philox_uniform(a.seed, a.offset, idx) >= a.dropout_p ? a.keep_scale : 0.f;
}

template <typename T, int NDT>
__device__ __forceinline__ void load_row(const T* p, int D, int lane, float* r) {
#pragma unroll
  for (int t = 0; t < NDT; ++t) {
    const int d = lane + 32 * t;
    r[t] = d < D ? to_f(p[d]) : 0.f;
  }
}
template <int NDT>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float s = 0.f;
#pragma unroll
  for (int t = 0; t < NDT; ++t) s += a[t] * b[t];
  return warp_sum(s);
}

template <typename T, int NDT>
__global__ void gen_fwd_kernel(GenArgs a, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               T* __restrict__ out, float* __restrict__ lse) {
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (i >= a.S) return;
  const int64_t bh = blockIdx.y;
  const int64_t bkv = (bh / a.Hq) * a.Hkv + (bh % a.Hq) / a.group;
  const int D = a.D;
  float qr[NDT], acc[NDT] = {}, kr[NDT], vr[NDT];
  load_row<T, NDT>(q + (bh * a.S + i) * D, D, lane, qr);
  float m = -INFINITY, l = 0.f;
  const ops::KeyRange r = ops::visible_keys(a.shape, bh / a.Hq, i);
  for (int j = static_cast<int>(r.lo); j < static_cast<int>(r.hi); ++j) {
    load_row<T, NDT>(k + (bkv * a.Sk + j) * D, D, lane, kr);
    load_row<T, NDT>(v + (bkv * a.Sk + j) * D, D, lane, vr);
    const float s = dot_row<NDT>(qr, kr) * a.scale;
    const float mn = fmaxf(m, s);
    const float alpha = expf(m - mn), p = expf(s - mn);
    l = l * alpha + p;
    const float pz = a.dropout_p > 0.f ? p * gen_drop(a, bh, i, j) : p;
#pragma unroll
    for (int t = 0; t < NDT; ++t) acc[t] = acc[t] * alpha + pz * vr[t];
    m = mn;
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int t = 0; t < NDT; ++t) {
    const int d = lane + 32 * t;
    if (d < D) out[(bh * a.S + i) * D + d] = from_f<T>(acc[t] * inv);
  }
  if (lane == 0) lse[bh * a.S + i] = l > 0.f ? m + logf(l) : INFINITY;
}

template <typename T, int NDT>
__global__ void gen_dq_kernel(GenArgs a, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              const T* __restrict__ dout, T* __restrict__ dq) {
  const int lane = threadIdx.x & 31;
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (i >= a.S) return;
  const int64_t bh = blockIdx.y;
  const int64_t bkv = (bh / a.Hq) * a.Hkv + (bh % a.Hq) / a.group;
  const int D = a.D;
  float qr[NDT], gr[NDT], kr[NDT], vr[NDT], acc[NDT] = {};
  load_row<T, NDT>(q + (bh * a.S + i) * D, D, lane, qr);
  load_row<T, NDT>(dout + (bh * a.S + i) * D, D, lane, gr);
  const float li = lse[bh * a.S + i], di = delta[bh * a.S + i];
  const ops::KeyRange r = ops::visible_keys(a.shape, bh / a.Hq, i);
  for (int j = static_cast<int>(r.lo); j < static_cast<int>(r.hi); ++j) {
    load_row<T, NDT>(k + (bkv * a.Sk + j) * D, D, lane, kr);
    load_row<T, NDT>(v + (bkv * a.Sk + j) * D, D, lane, vr);
    const float p = expf(dot_row<NDT>(qr, kr) * a.scale - li);
    float dp = dot_row<NDT>(gr, vr);
    if (a.dropout_p > 0.f) dp *= gen_drop(a, bh, i, j);
    const float ds = p * (dp - di);
#pragma unroll
    for (int t = 0; t < NDT; ++t) acc[t] += ds * kr[t];
  }
#pragma unroll
  for (int t = 0; t < NDT; ++t) {
    const int d = lane + 32 * t;
    if (d < D) dq[(bh * a.S + i) * D + d] = from_f<T>(acc[t] * a.scale);
  }
}

template <typename T, int NDT>
__global__ void gen_dkdv_kernel(GenArgs a, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                const float* __restrict__ lse, const float* __restrict__ delta,
                                const T* __restrict__ dout, T* __restrict__ dk, T* __restrict__ dv) {
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (j >= a.Sk) return;
  const int64_t bkv = blockIdx.y;
  const int64_t b = bkv / a.Hkv, hk = bkv % a.Hkv;
  const int D = a.D;
  float kr[NDT], vr[NDT], qr[NDT], gr[NDT], ak[NDT] = {}, av[NDT] = {};
  load_row<T, NDT>(k + (bkv * a.Sk + j) * D, D, lane, kr);
  load_row<T, NDT>(v + (bkv * a.Sk + j) * D, D, lane, vr);
  // Causal: no query before this key's position sees it.
  const int64_t first = a.causal ? a.shape.k_pos + j - a.shape.q_pos : 0;
  for (int hg = 0; hg < a.group; ++hg) {
    const int64_t bh = b * a.Hq + hk * a.group + hg;
    for (int i = first > 0 ? static_cast<int>(first) : 0; i < a.S; ++i) {
      if (!a.plain) {
        const ops::KeyRange r = ops::visible_keys(a.shape, b, i);
        if (j < r.lo || j >= r.hi) continue;  // uniform over the warp: the row is the warp's
      }
      load_row<T, NDT>(q + (bh * a.S + i) * D, D, lane, qr);
      load_row<T, NDT>(dout + (bh * a.S + i) * D, D, lane, gr);
      const float p = expf(dot_row<NDT>(qr, kr) * a.scale - lse[bh * a.S + i]);
      const float z = a.dropout_p > 0.f ? gen_drop(a, bh, i, j) : 1.f;
      const float dp = dot_row<NDT>(gr, vr);
      const float ds = p * (dp * z - delta[bh * a.S + i]);
#pragma unroll
      for (int t = 0; t < NDT; ++t) {
        av[t] += p * z * gr[t];
        ak[t] += ds * qr[t];
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NDT; ++t) {
    const int d = lane + 32 * t;
    if (d < D) {
      dk[(bkv * a.Sk + j) * D + d] = from_f<T>(ak[t] * a.scale);
      dv[(bkv * a.Sk + j) * D + d] = from_f<T>(av[t]);
    }
  }
}

template <typename T>
__global__ void delta_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                             int64_t rows, int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (r >= rows) return;
  float s = 0.f;
  for (int64_t d = lane; d < D; d += 32) s += to_f(out[r * D + d]) * to_f(dout[r * D + d]);
  s = warp_sum(s);
  if (lane == 0) delta[r] = s;
}

// The common case (D = G * 16-byte vector, G a power of two <= 32): G lanes per row, one vector
// each, a shuffle reduction over the G lanes (fixed order).
template <typename T>
__global__ void delta_vec_kernel(const T* __restrict__ out, const T* __restrict__ dout, float* __restrict__ delta,
                                 int64_t rows, int log2g) {
  constexpr int N = Vec<T>::N;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t r = t >> log2g;
  const int sub = static_cast<int>(t & ((1 << log2g) - 1));
  const int64_t D = static_cast<int64_t>(N) << log2g;
  float s = 0.f;
  if (r < rows) {
    float a[N], b[N];
    Vec<T>::load(out + r * D + sub * N, a);
    Vec<T>::load(dout + r * D + sub * N, b);
#pragma unroll
    for (int e = 0; e < N; ++e) s += a[e] * b[e];
  }
  for (int o = (1 << log2g) >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (r < rows && sub == 0) delta[r] = s;
}

GenArgs make_gen(const ops::AttentionShape& p) {
  MT_CHECK(p.D <= 256, "attention head dim {} > 256 is not supported on the GPU", p.D);
  MT_CHECK(p.B >= 0 && p.S >= 0 && p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.B * p.Hq < 65536,
           "bad attention shape B={} Hq={} Hkv={} S={} D={}", p.B, p.Hq, p.Hkv, p.S, p.D);
  GenArgs a{};
  a.S = static_cast<int>(p.S);
  a.Sk = static_cast<int>(p.keys());
  a.shape = p;
  a.plain = p.plain();
  a.Hq = static_cast<int>(p.Hq);
  a.Hkv = static_cast<int>(p.Hkv);
  a.group = static_cast<int>(p.Hq / p.Hkv);
  a.D = static_cast<int>(p.D);
  a.scale = p.scale;
  a.causal = p.causal;
  a.dropout_p = p.dropout_p;
  a.keep_scale = p.dropout_p < 1.f ? 1.f / (1.f - p.dropout_p) : 0.f;
  a.seed = p.seed;
  a.offset = p.offset;
  return a;
}

// Calls f.template operator()<NDT>() with NDT = head-dim slots per lane.
template <typename F>
void dispatch_ndt(int64_t D, F f) {
  if (D <= 32)
    f(std::integral_constant<int, 1>{});
  else if (D <= 64)
    f(std::integral_constant<int, 2>{});
  else if (D <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

}  // namespace

template <typename T>
void attention_delta(const T* out, const T* dout, float* delta, int64_t rows, int64_t D, cudaStream_t s) {
  if (rows == 0) return;
  constexpr int N = Vec<T>::N;
  const int64_t g = D / N;
  if (D % N == 0 && g <= 32 && (g & (g - 1)) == 0 && aligned16(out) && aligned16(dout)) {
    int log2g = 0;
    while ((int64_t{1} << log2g) < g) ++log2g;
    delta_vec_kernel<<<static_cast<unsigned>(ceil_div(rows * g, 256)), 256, 0, s>>>(out, dout, delta, rows, log2g);
  } else {
    delta_kernel<<<static_cast<unsigned>(ceil_div(rows, 8)), 256, 0, s>>>(out, dout, delta, rows, D);
  }
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void attention_forward_generic(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, nd<T>* out,
                               float* lse, cudaStream_t s) {
  const GenArgs a = make_gen(p);
  if (p.B * p.Hq * p.S == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.S, kWarps)), static_cast<unsigned>(p.B * p.Hq));
  dispatch_ndt(p.D, [&](auto ndt) {
    gen_fwd_kernel<T, decltype(ndt)::value><<<grid, kWarps * 32, 0, s>>>(a, q, k, v, out, lse);
    MT_CUDA_LAUNCH_CHECK();
  });
}

template <typename T>
void attention_backward_generic(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v,
                                const nd<T>* out, const float* lse, const nd<T>* dout, nd<T>* dq, nd<T>* dk, nd<T>* dv,
                                cudaStream_t s) {
  const GenArgs a = make_gen(p);
  if (p.B * p.Hq * p.S == 0) return;
  Scratch delta(static_cast<size_t>(p.B * p.Hq * p.S) * sizeof(float), s);
  attention_delta(out, dout, delta.as<float>(), p.B * p.Hq * p.S, p.D, s);
  const dim3 gq(static_cast<unsigned>(ceil_div(p.S, kWarps)), static_cast<unsigned>(p.B * p.Hq));
  const dim3 gk(static_cast<unsigned>(ceil_div(p.keys(), kWarps)), static_cast<unsigned>(p.B * p.Hkv));
  dispatch_ndt(p.D, [&](auto ndt) {
    constexpr int N = decltype(ndt)::value;
    gen_dq_kernel<T, N><<<gq, kWarps * 32, 0, s>>>(a, q, k, v, lse, delta.as<float>(), dout, dq);
    MT_CUDA_LAUNCH_CHECK();
    gen_dkdv_kernel<T, N><<<gk, kWarps * 32, 0, s>>>(a, q, k, v, lse, delta.as<float>(), dout, dk, dv);
    MT_CUDA_LAUNCH_CHECK();
  });
}

MT_INSTANTIATE(attention_delta, float);
MT_INSTANTIATE(attention_delta, bf16);
MT_INSTANTIATE(attention_forward_generic, float);
MT_INSTANTIATE(attention_forward_generic, bf16);
MT_INSTANTIATE(attention_backward_generic, float);
MT_INSTANTIATE(attention_backward_generic, bf16);

}  // namespace mt::cuda
