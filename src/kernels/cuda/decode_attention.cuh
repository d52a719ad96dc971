#pragma once
// Decode attention for grouped queries (ops::DecodeKernels' kernel, issue #22): the work of one
// (row, key/value group, key split) for a team of kGqaWarps warps, shared by kv_cache.cu's kernel
// (a team per block) and decode_stack.cu's whole-stack kernel (four teams per block, each with a
// named barrier of its own), so that both compute the same bits.
//
// Why this shape: at batch 1 a kernel of one warp per key is a latency chain (each warp has 2
// keys x 2-byte loads in flight, K then V, ~6 rounds per split) and each of a group's query heads
// re-reads the group's K/V. Here a team owns one (row, group, split) and all of the group's query
// heads: LPK = D/8 lanes hold one key's 16-byte chunks, a warp covers 32/LPK keys per step, and
// every lane issues kGqaUnroll steps of K and V loads before using any, so a split of up to
// kGqaWarps*32/LPK*kGqaUnroll keys costs about one memory round trip. Each K/V element is loaded
// once and used by the QMAX (>= Hq/G) heads. Partial results per (row, head, split): D
// unnormalised outputs, then max, then sum. With `arrivals`, each team counts itself in on its
// (row, group)'s counter once its partial results are out, and the last of the splits to arrive
// merges them for the group's heads (merged_channel) and sets the counter back to 0 for the next
// launch. q, K and V are read through L2 (not L1): in decode_stack.cu's kernel they were written
// by other SMs earlier in the same launch.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dependent_launch.cuh"

namespace mt::cuda {

constexpr int kGqaWarps = 4, kGqaUnroll = 4;

template <typename T>
struct GqaArgs {
  const T* q;  // [1, Hq, N, D]
  const T* kc;
  const T* vc;  // [slots, G, L, D]
  const int32_t* slot;
  const int32_t* pos;  // [N]
  T* out;              // [N, Hq * D]
  float* part;         // [N, Hq, splits, D + 2] (splits > 1)
  int64_t N, Hq, G, L, slots;
  int splits;
  int64_t per_split;
  float scale;
  int* arrivals;  // [N * G] zeroed counters (the fused merge), or null
};

// A team's shared memory.
template <int QMAX, int D>
struct GqaShared {
  float m[kGqaWarps][QMAX], l[kGqaWarps][QMAX], acc[kGqaWarps][QMAX][D];
  int last;
};

// The device's SM count (the decode kernels size their grids by it).
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return std::max(v, 1);
  }();
  return n;
}

// Splits of the keys: only while rows x groups leave SMs idle, never below one round of a team's
// loads per split (the positions are not known on the host: the cache's length L bounds them).
inline int gqa_splits(int64_t rows_x_groups, int64_t L, int64_t D, int sms) {
  const int64_t keys_per_round = kGqaWarps * (32 / (D / 8)) * kGqaUnroll, want = 2 * static_cast<int64_t>(sms);
  if (rows_x_groups >= want) return 1;
  return std::max(1, static_cast<int>(std::min<int64_t>(
                         {(want + rows_x_groups - 1) / rows_x_groups, (L + keys_per_round - 1) / keys_per_round, 64})));
}

// Channel d of one (row, head)'s attention from its splits' partial results (base: per split D
// unnormalised outputs, then max, then sum), normalised. Loads that bypass L1: the fused merge
// reads what other SMs wrote during the same kernel. The loads go out kMergeBatch splits at a
// time before any is used (one L2 round trip per batch, not one per split); the arithmetic is
// the split-by-split order either way.
constexpr int kMergeBatch = 8;
__device__ __forceinline__ float merged_channel(const float* base, int64_t d, int64_t D, int splits) {
  float M = -INFINITY;
  for (int s0 = 0; s0 < splits; s0 += kMergeBatch) {
    float ms[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) ms[j] = s0 + j < splits ? __ldcg(base + (s0 + j) * (D + 2) + D) : -INFINITY;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) M = fmaxf(M, ms[j]);
  }
  float Lsum = 0.f, o = 0.f;
  for (int s0 = 0; s0 < splits; s0 += kMergeBatch) {
    float ms[kMergeBatch], ls[kMergeBatch], os[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const bool in = s0 + j < splits;
      const float* p = base + (in ? s0 + j : 0) * (D + 2);
      ms[j] = in ? __ldcg(p + D) : -INFINITY;
      ls[j] = __ldcg(p + D + 1);
      os[j] = __ldcg(p + d);
    }
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      if (ms[j] == -INFINITY) continue;
      const float e = __expf(ms[j] - M);
      Lsum += ls[j] * e;
      o += os[j] * e;
    }
  }
  return Lsum > 0.f ? o / Lsum : 0.f;
}

template <int LPK>
__device__ __forceinline__ float key_sum(float v) {  // over the LPK lanes that share a key
#pragma unroll
  for (int o = LPK / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Folds softmax state (mb, lb, accb) into (m, l, acc): the running max, the sum of exp(s - m)
// and the exp-weighted V sum, either side possibly empty (max -inf).
__device__ __forceinline__ void fold(float& m, float& l, float* acc, float mb, float lb, const float* accb) {
  const float M = fmaxf(m, mb);
  const float a = m == -INFINITY ? 0.f : __expf(m - M), b = mb == -INFINITY ? 0.f : __expf(mb - M);
  l = l * a + lb * b;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * a + accb[e] * b;
  m = M;
}

// The keys [begin, end) of (row i, group g, split) and their cache rows.
template <typename T, int LPK>
struct GqaRange {
  int64_t begin, end, p;
  bool valid;
  const T* kb;
  const T* vb;
  __device__ GqaRange(const GqaArgs<T>& a, int64_t i, int64_t g, int split) {
    constexpr int64_t D = LPK * 8;
    const int64_t s = a.slot[i];
    p = a.pos[i];
    valid = s >= 0 && s < a.slots && p >= 0 && p < a.L;
    begin = split * a.per_split;
    end = valid ? min(p + 1, begin + a.per_split) : begin;
    kb = a.kc + (valid ? (s * a.G + g) * a.L * D : 0);
    vb = a.vc + (valid ? (s * a.G + g) * a.L * D : 0);
  }
};

// Before the team's wait for q and the new key and value: this split's older keys and values,
// which nothing in this step writes, into L2, a 16-byte-aligned row of D elements per thread and step.
template <typename T, int LPK>
__device__ __forceinline__ void gqa_prefetch(const GqaArgs<T>& a, int64_t i, int64_t g, int split, int tid) {
  constexpr int64_t D = LPK * 8;
  const GqaRange<T, LPK> r(a, i, g, split);
  if (!r.valid) return;
  for (int64_t j = r.begin + tid; j < min(r.end, r.p); j += kGqaWarps * 32)
    for (int64_t o = 0; o < D; o += 128 / static_cast<int64_t>(sizeof(T))) {
      prefetch_l2(r.kb + j * D + o);
      prefetch_l2(r.vb + j * D + o);
    }
}

// The team's attention for (row i, group g, split); tid in [0, kGqaWarps * 32); sync() is the
// team's barrier (__syncthreads for a team of a whole block).
template <typename T, int LPK, int QMAX, typename Sync>
__device__ __forceinline__ void gqa_attend(const GqaArgs<T>& a, int64_t i, int64_t g, int split, int tid,
                                           GqaShared<QMAX, LPK * 8>& sm, Sync sync) {
  constexpr int D = LPK * 8, KPW = 32 / LPK;  // head dim; keys per warp step
  const int warp = tid / 32, lane = tid % 32;
  const int sub = lane / LPK, d0 = (lane % LPK) * 8;
  const int qpg = static_cast<int>(a.Hq / a.G);
  const int64_t N = a.N, Hq = a.Hq, splits = a.splits;
  const GqaRange<T, LPK> r(a, i, g, split);
  const int64_t begin = r.begin, end = r.end;
  float qv[QMAX][8], acc[QMAX][8], m[QMAX], l[QMAX];
#pragma unroll
  for (int h = 0; h < QMAX; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) qv[h][e] = acc[h][e] = 0.f;
  }
  uint4 qr[QMAX];  // every head's load out before any is used (heads past qpg read head 0, unused)
#pragma unroll
  for (int h = 0; h < QMAX; ++h)
    qr[h] = __ldcg(reinterpret_cast<const uint4*>(a.q + ((g * qpg + (h < qpg ? h : 0)) * N + i) * D + d0));
#pragma unroll
  for (int h = 0; h < QMAX; ++h) {
    if (h < qpg) {
      Vec<T>::unpack(qr[h], qv[h]);
#pragma unroll
      for (int e = 0; e < 8; ++e) qv[h][e] *= a.scale;
    }
  }
  for (int64_t j0 = begin + static_cast<int64_t>(warp) * KPW * kGqaUnroll; j0 < end;
       j0 += static_cast<int64_t>(kGqaWarps) * KPW * kGqaUnroll) {
    uint4 kr[kGqaUnroll], vr[kGqaUnroll];
#pragma unroll
    for (int u = 0; u < kGqaUnroll; ++u) {  // every load of the round issued before any is used
      const int64_t j = j0 + u * KPW + sub;
      kr[u] = j < end ? __ldcg(reinterpret_cast<const uint4*>(r.kb + j * D + d0)) : make_uint4(0, 0, 0, 0);
      vr[u] = j < end ? __ldcg(reinterpret_cast<const uint4*>(r.vb + j * D + d0)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGqaUnroll; ++u) {
      const int64_t j = j0 + u * KPW + sub;
      float kf[8], vf[8];
      Vec<T>::unpack(kr[u], kf);
      Vec<T>::unpack(vr[u], vf);
#pragma unroll
      for (int h = 0; h < QMAX; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(qv[h][e], kf[e], dot);
        dot = key_sum<LPK>(dot);  // every lane shuffles (uniform), the invalid keys' result unused
        if (h < qpg && j < end) {
          float one[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) one[e] = vf[e];
          fold(m[h], l[h], acc[h], dot, 1.f, one);
        }
      }
    }
  }
  // The warp's key groups (lanes sub = 0..KPW-1 with the same channels), then the team's warps.
#pragma unroll
  for (int h = 0; h < QMAX; ++h) {
#pragma unroll
    for (int o = LPK; o < 32; o <<= 1) {
      float accb[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) accb[e] = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
      const float mb = __shfl_xor_sync(0xffffffffu, m[h], o), lb = __shfl_xor_sync(0xffffffffu, l[h], o);
      fold(m[h], l[h], acc[h], mb, lb, accb);
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int h = 0; h < QMAX; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e) sm.acc[warp][h][d0 + e] = acc[h][e];
      if (lane == 0) sm.m[warp][h] = m[h], sm.l[warp][h] = l[h];
    }
  }
  sync();
  for (int idx = tid; idx < qpg * D; idx += kGqaWarps * 32) {
    const int h = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int w = 0; w < kGqaWarps; ++w) M = fmaxf(M, sm.m[w][h]);
    float Lsum = 0.f, o = 0.f;
    for (int w = 0; w < kGqaWarps; ++w) {
      const float sw = sm.m[w][h] == -INFINITY ? 0.f : __expf(sm.m[w][h] - M);
      Lsum += sm.l[w][h] * sw;
      o += sm.acc[w][h][d] * sw;
    }
    const int64_t hq = g * qpg + h, row = (i * Hq + hq) * splits + split;
    if (splits == 1) {
      a.out[i * Hq * D + hq * D + d] = from_f<T>(Lsum > 0.f ? o / Lsum : 0.f);
    } else {
      a.part[row * (D + 2) + d] = o;
      if (d == 0) a.part[row * (D + 2) + D] = M, a.part[row * (D + 2) + D + 1] = Lsum;
    }
  }
  if (splits == 1 || !a.arrivals) return;
  __threadfence();  // this team's partial results visible to the whole device before it counts
  sync();
  if (tid == 0) {
    int* count = a.arrivals + i * a.G + g;
    sm.last = atomicAdd(count, 1) == splits - 1;
    if (sm.last) *count = 0;  // every split has arrived: ready for the next launch
  }
  sync();
  const bool last = sm.last;
  sync();  // sm is the team's next item's: everyone has read `last`
  if (!last) return;
  __threadfence();
  for (int idx = tid; idx < qpg * D; idx += kGqaWarps * 32) {
    const int h = idx / D, d = idx % D;
    const int64_t hq = g * qpg + h;
    a.out[i * Hq * D + hq * D + d] =
        from_f<T>(merged_channel(a.part + (i * Hq + hq) * splits * (D + 2), d, D, static_cast<int>(splits)));
  }
}

}  // namespace mt::cuda
