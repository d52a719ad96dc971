// Flash attention backward on tensor cores (bf16 in, fp32 accumulate), head dims 64 and 128,
// as two kernels that each own their outputs (no atomics, so deterministic):
//  * dK/dV: one CTA per (batch*kv head, key block of 16*NW keys); each warp owns 16 keys and
//    keeps dK, dV in registers while the CTA walks every query block of every query head of the
//    group (GQA sums happen in registers). It computes S^T = K Q^T and dP^T = V dO^T, so P^T and
//    dS^T are A operands in registers for dV += P^T dO and dK += dS^T Q.
//  * dQ: one CTA per (batch*head, query block), as the forward, recomputing P and dP to form
//    dQ += dS K.
// P and dP are recomputed twice (7 products instead of 5): the price of determinism without a
// dQ reduction buffer. Causal: tiles above the diagonal are skipped per CTA and per warp, and
// the longest blocks are launched first. delta = rowsum(dO * O) comes from a small kernel first.
// Ranged calls (RANGED: chunks at positions, packed documents; no dropout) mask by row_keys as
// the forward does; a dK/dV block walks only the query blocks whose rows reach its keys (found
// by binary search, both ends of a row's key range rising with the row).
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/mma.cuh"

namespace mt::cuda {

namespace {

using namespace mma;
using namespace attn;

// ---------------------------------------------------------------- backward: dQ
template <int D, int NW, bool DROP, bool RANGED>
__global__ void __launch_bounds__(NW * 32) flash_bwd_dq_kernel(const TcArgs a) {
  static_assert(!(DROP && RANGED), "ranged calls with dropout run the generic kernels");
  constexpr int BR = 16 * NW, BC = 64, KS = D / 16, NT = BC / 8, DT = D / 8;
  using Tile = SwizzledTile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sdO = sQ + BR * D;
  bf16* sK = sdO + BR * D;     // [2][BC][D]
  bf16* sV = sK + 2 * BC * D;  // [2][BC][D]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int S = a.S, Sk = RANGED ? a.Sk : a.S;
  const int qb = a.causal ? static_cast<int>(gridDim.y - 1 - blockIdx.y) : static_cast<int>(blockIdx.y);
  const int64_t bh = blockIdx.x, b = bh / a.Hq;
  const int64_t bkv = b * a.Hkv + (bh % a.Hq) / a.group;
  const int q0 = qb * BR;
  const bf16* Kg = a.k + bkv * Sk * D;
  const bf16* Vg = a.v + bkv * Sk * D;
  const int wrow0 = q0 + warp * 16;
  const KeyTiles kt = key_tiles<BR, BC, RANGED>(a, b, q0, wrow0);
  const int kb0 = kt.kb0, nkb = kt.nkb, w_lo = kt.w_lo, w_hi = kt.w_hi;

  Tile::template load<NW * 32>(sQ, a.q + (bh * S + q0) * D, BR, min(BR, S - q0));
  Tile::template load<NW * 32>(sdO, a.dout + (bh * S + q0) * D, BR, min(BR, S - q0));
  {
    const int first = nkb > 0 ? kb0 * BC : 0, valid = nkb > 0 ? min(BC, Sk - first) : 0;
    Tile::template load<NW * 32>(sK, Kg + static_cast<int64_t>(first) * D, BC, valid);
    Tile::template load<NW * 32>(sV, Vg + static_cast<int64_t>(first) * D, BC, valid);
  }
  cp_async_commit();

  const int rows[2] = {wrow0 + g, wrow0 + g + 8};
  ops::KeyRange rk[2] = {{0, 0}, {0, 0}};  // ranged: each of the thread's rows' keys
  if constexpr (RANGED)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (rows[r] < S) rk[r] = row_keys(a, b, rows[r]);
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool ok = rows[r] < S;
    lse2[r] = ok ? a.lse[bh * S + rows[r]] * kLog2e : INFINITY;
    di[r] = ok ? a.delta[bh * S + rows[r]] : 0.f;
  }
  uint32_t qf[KS][4];
  float dq[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

  for (int j = 0; j < nkb; ++j) {
    const int kb = kb0 + j;  // the tile in hand is in buffer j & 1
    cp_async_wait_all();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
        ldsm_x4(smem_addr(sQ + Tile::offset(warp * 16 + (lane & 15), ks * 2 + (lane >> 4))), qf[ks][0], qf[ks][1],
                qf[ks][2], qf[ks][3]);
    }
    if (j + 1 < nkb) {
      const int nxt = (kb + 1) * BC;
      Tile::template load<NW * 32>(sK + ((j + 1) & 1) * BC * D, Kg + static_cast<int64_t>(nxt) * D, BC,
                                   min(BC, Sk - nxt));
      Tile::template load<NW * 32>(sV + ((j + 1) & 1) * BC * D, Vg + static_cast<int64_t>(nxt) * D, BC,
                                   min(BC, Sk - nxt));
    }
    cp_async_commit();
    const int kv0 = kb * BC;
    if constexpr (RANGED) {
      if (kv0 >= w_hi || kv0 + BC <= w_lo) continue;
    } else if (a.causal && kv0 > wrow0 + 15) {
      continue;
    }
    const bf16* cK = sK + (j & 1) * BC * D;
    const bf16* cV = sV + (j & 1) * BC * D;

    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t dof[4];
      ldsm_x4(smem_addr(sdO + Tile::offset(warp * 16 + (lane & 15), ks * 2 + (lane >> 4))), dof[0], dof[1], dof[2],
              dof[3]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_addr(cK + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(sc[2 * np], qf[ks], b0, b1);
        mma_bf16(sc[2 * np + 1], qf[ks], b2, b3);
        ldsm_x4(smem_addr(cV + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(dp[2 * np], dof, b0, b1);
        mma_bf16(dp[2 * np + 1], dof, b2, b3);
      }
    }
    const bool need_mask = kv0 + BC > S || (a.causal && kv0 + BC - 1 > wrow0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kv0 + nt * 8 + 2 * tq + (e & 1), row = rows[e >> 1];
        float p = exp2f(sc[nt][e] * a.scale_log2 - lse2[e >> 1]);
        if constexpr (RANGED) {
          if (col < rk[e >> 1].lo || col >= rk[e >> 1].hi) p = 0.f;
        } else if (need_mask && (col >= S || (a.causal && col > row))) {
          p = 0.f;
        }
        float dpv = dp[nt][e];
        if constexpr (DROP)
          if (col < S && row < S) dpv *= drop_factor(a, bh, row, col);
        sc[nt][e] = p * (dpv - di[e >> 1]);  // dS
      }
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint32_t da[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dpi = 0; dpi < D / 16; ++dpi) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(smem_addr(cK + Tile::offset(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dpi * 2 + (lane >> 4))),
                  b0, b1, b2, b3);
        mma_bf16(dq[2 * dpi], da, b0, b1);
        mma_bf16(dq[2 * dpi + 1], da, b2, b3);
      }
    }
  }

  if (nkb == 0) {  // no tile was awaited: Q's copy must land before sQ becomes the staging area
    cp_async_wait_all();
    __syncthreads();
  }
  bf16* stage = sQ;  // the warp's own Q rows (its fragments are in registers)
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    *reinterpret_cast<uint32_t*>(stage + Tile::offset(warp * 16 + g, dt) + 2 * tq) =
        pack_bf16(dq[dt][0] * a.scale, dq[dt][1] * a.scale);
    *reinterpret_cast<uint32_t*>(stage + Tile::offset(warp * 16 + g + 8, dt) + 2 * tq) =
        pack_bf16(dq[dt][2] * a.scale, dq[dt][3] * a.scale);
  }
  __syncwarp();
  for (int idx = lane; idx < 16 * Tile::kChunks; idx += 32) {
    const int r = idx / Tile::kChunks, c = idx % Tile::kChunks;
    if (wrow0 + r < S)
      *reinterpret_cast<uint4*>(a.dq + (bh * S + wrow0 + r) * D + c * 8) =
          *reinterpret_cast<const uint4*>(stage + Tile::offset(warp * 16 + r, c));
  }
}

// ---------------------------------------------------------------- backward: dK, dV
// Ranged calls: the query blocks [x, y) (of BR rows) whose rows reach keys [k0, k1) of sample
// b. Those rows are [r_a, r_b): r_a the first whose keys end past k0, r_b the first whose keys
// start at or after k1; both ends rise with the row, so each is a binary search.
__device__ __forceinline__ int2 ranged_query_blocks(const TcArgs& a, int64_t b, int k0, int k1, int BR) {
  int lo = 0, hi = a.S;
  while (lo < hi) {
    const int m = (lo + hi) / 2;
    if (row_keys(a, b, m).hi > k0) hi = m;
    else lo = m + 1;
  }
  const int r_a = lo;
  hi = a.S;
  while (lo < hi) {
    const int m = (lo + hi) / 2;
    if (row_keys(a, b, m).lo >= k1) hi = m;
    else lo = m + 1;
  }
  const int r_b = lo;
  return make_int2(r_a / BR, r_b > r_a ? (r_b + BR - 1) / BR : r_a / BR);
}

// D = 64 fits three CTAs per SM under the 170-register cap this asks for (ptxas reports a few
// bytes of spill for it, cheaper than a third fewer warps to hide latency with).
template <int D, int NW, int BR, bool DROP, bool RANGED>
__global__ void __launch_bounds__(NW * 32, D == 64 ? 3 : 1) flash_bwd_dkdv_kernel(const TcArgs a) {
  static_assert(!(DROP && RANGED), "ranged calls with dropout run the generic kernels");
  constexpr int BC = 16 * NW, KS = D / 16, NT = BR / 8, DT = D / 8, kThreads = NW * 32;
  using Tile = SwizzledTile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + BC * D;
  bf16* sQ = sV + BC * D;                                    // [2][BR][D]
  bf16* sdO = sQ + 2 * BR * D;                               // [2][BR][D]
  float* sLse = reinterpret_cast<float*>(sdO + 2 * BR * D);  // [2][BR], log2 units
  float* sDi = sLse + 2 * BR;                                // [2][BR]
  int* sLo = reinterpret_cast<int*>(sDi + 2 * BR);           // ranged: [2][BR] each row's keys [lo, hi)
  int* sHi = sLo + 2 * BR;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int S = a.S, Sk = RANGED ? a.Sk : a.S;
  const int k0 = blockIdx.y * BC;  // y = key block: with causal masking the first are the longest
  const int64_t bkv = blockIdx.x;
  const int64_t b = bkv / a.Hkv, hk = bkv % a.Hkv;
  const int2 qbs = RANGED ? ranged_query_blocks(a, b, k0, min(k0 + BC, Sk), BR)
                         : make_int2(a.causal ? k0 / BR : 0, (S + BR - 1) / BR);
  const int qb_start = qbs.x;
  const int per_head = qbs.y - qb_start;
  const int iters = per_head * a.group;

  Tile::template load<kThreads>(sK, a.k + (bkv * Sk + k0) * D, BC, min(BC, Sk - k0));
  Tile::template load<kThreads>(sV, a.v + (bkv * Sk + k0) * D, BC, min(BC, Sk - k0));
  auto issue = [&](int it) {
    const int buf = it & 1;
    const int64_t bh = b * a.Hq + hk * a.group + it / per_head;
    const int q0 = (qb_start + it % per_head) * BR;
    const int valid = min(BR, S - q0);
    Tile::template load<kThreads>(sQ + buf * BR * D, a.q + (bh * S + q0) * D, BR, valid);
    Tile::template load<kThreads>(sdO + buf * BR * D, a.dout + (bh * S + q0) * D, BR, valid);
    for (int i = threadIdx.x; i < BR; i += kThreads) {
      const bool ok = i < valid;
      sLse[buf * BR + i] = ok ? a.lse[bh * S + q0 + i] * kLog2e : INFINITY;
      sDi[buf * BR + i] = ok ? a.delta[bh * S + q0 + i] : 0.f;
      if constexpr (RANGED) {
        const ops::KeyRange r = ok ? row_keys(a, b, q0 + i) : ops::KeyRange{0, 0};
        sLo[buf * BR + i] = static_cast<int>(r.lo);
        sHi[buf * BR + i] = static_cast<int>(r.hi);
      }
    }
  };
  if (iters > 0) issue(0);
  cp_async_commit();

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  const int wkey0 = k0 + warp * 16;
  const int keys[2] = {wkey0 + g, wkey0 + g + 8};

  for (int it = 0; it < iters; ++it) {
    cp_async_wait_all();
    __syncthreads();
    if (it + 1 < iters) issue(it + 1);
    cp_async_commit();
    const int buf = it & 1;
    const int64_t bh = b * a.Hq + hk * a.group + it / per_head;
    const int q0 = (qb_start + it % per_head) * BR;
    if constexpr (RANGED) {
      // Past the keys, or the block's first row starts after this warp's keys, or its last ends
      // before them.
      if (wkey0 >= Sk || sLo[buf * BR] >= wkey0 + 16 || sHi[buf * BR + min(BR, S - q0) - 1] <= wkey0) continue;
    } else {
      if (a.causal && wkey0 > q0 + BR - 1) continue;  // this warp's keys are after every query here
      if (wkey0 >= S) continue;
    }
    const bf16* cQ = sQ + buf * BR * D;
    const bf16* cdO = sdO + buf * BR * D;
    const float* cLse = sLse + buf * BR;
    const float* cDi = sDi + buf * BR;

    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t kf[4], vf[4];
      ldsm_x4(smem_addr(sK + Tile::offset(warp * 16 + (lane & 15), ks * 2 + (lane >> 4))), kf[0], kf[1], kf[2], kf[3]);
      ldsm_x4(smem_addr(sV + Tile::offset(warp * 16 + (lane & 15), ks * 2 + (lane >> 4))), vf[0], vf[1], vf[2], vf[3]);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_addr(cQ + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(sc[2 * np], kf, b0, b1);
        mma_bf16(sc[2 * np + 1], kf, b2, b3);
        ldsm_x4(smem_addr(cdO + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(dp[2 * np], vf, b0, b1);
        mma_bf16(dp[2 * np + 1], vf, b2, b3);
      }
    }
    // sc becomes the probabilities that reached V (P^T, times the dropout factor), dp becomes dS^T.
    const bool need_mask = q0 + BR > S || wkey0 + 16 > S || (a.causal && wkey0 + 15 > q0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * tq + (e & 1), col = q0 + qi, key = keys[e >> 1];
        float p = exp2f(sc[nt][e] * a.scale_log2 - cLse[qi]);
        if constexpr (RANGED) {
          if (key < sLo[buf * BR + qi] || key >= sHi[buf * BR + qi]) p = 0.f;
        } else if (need_mask && (col >= S || key >= S || (a.causal && key > col))) {
          p = 0.f;
        }
        float z = 1.f;
        if constexpr (DROP)
          if (col < S && key < S) z = drop_factor(a, bh, col, key);
        sc[nt][e] = p * z;
        dp[nt][e] = p * (dp[nt][e] * z - cDi[qi]);
      }
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      const uint32_t da[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]), pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                              pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                              pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
      for (int dpi = 0; dpi < D / 16; ++dpi) {
        const int r = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c = dpi * 2 + (lane >> 4);
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(smem_addr(cdO + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(dv[2 * dpi], pa, b0, b1);
        mma_bf16(dv[2 * dpi + 1], pa, b2, b3);
        ldsm_x4_t(smem_addr(cQ + Tile::offset(r, c)), b0, b1, b2, b3);
        mma_bf16(dk[2 * dpi], da, b0, b1);
        mma_bf16(dk[2 * dpi + 1], da, b2, b3);
      }
    }
  }

  // Each thread holds rows keys[0], keys[1], columns dt*8 + 2tq..+1 of dK and dV.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (keys[r] >= Sk) continue;
    bf16* dkr = a.dk + (bkv * Sk + keys[r]) * D;
    bf16* dvr = a.dv + (bkv * Sk + keys[r]) * D;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      *reinterpret_cast<uint32_t*>(dkr + dt * 8 + 2 * tq) =
          pack_bf16(dk[dt][2 * r] * a.scale, dk[dt][2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dvr + dt * 8 + 2 * tq) = pack_bf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <int D, bool DROP, bool RANGED = false>
void launch_backward(const TcArgs& a, int64_t B, cudaStream_t s) {
  {
    constexpr int NW = 4, BR = 16 * NW, BC = 64;
    const size_t smem = static_cast<size_t>(2 * BR * D + 4 * BC * D) * sizeof(bf16);
    auto kern = flash_bwd_dq_kernel<D, NW, DROP, RANGED>;
    static const bool once = (set_smem(kern, smem), true);
    (void)once;
    const dim3 grid(static_cast<unsigned>(B * a.Hq), static_cast<unsigned>(ceil_div(a.S, BR)));
    kern<<<grid, NW * 32, smem, s>>>(a);
    MT_CUDA_LAUNCH_CHECK();
  }
  {
    constexpr int NW = 4, BC = 16 * NW, BR = D == 128 ? 32 : 64;
    const size_t smem = static_cast<size_t>(2 * BC * D + 4 * BR * D) * sizeof(bf16) + 4 * BR * sizeof(float) +
                        (RANGED ? 4 * BR * sizeof(int) : 0);
    auto kern = flash_bwd_dkdv_kernel<D, NW, BR, DROP, RANGED>;
    static const bool once = (set_smem(kern, smem), true);
    (void)once;
    const dim3 grid(static_cast<unsigned>(B * a.Hkv), static_cast<unsigned>(ceil_div(a.Sk, BC)));
    kern<<<grid, NW * 32, smem, s>>>(a);
    MT_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

// fp32 storage runs the generic kernels; bf16 cuDNN or the tensor-core kernels where they serve.
template <typename T>
void attention_backward(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, const nd<T>* out,
                        const float* lse, const nd<T>* dout, nd<T>* dq, nd<T>* dk, nd<T>* dv, cudaStream_t s) {
  if constexpr (!std::is_same_v<T, bf16>) {
    attention_backward_generic(p, q, k, v, out, lse, dout, dq, dk, dv, s);
  } else {
    check_params(p);
    // Chunks and packed documents (ranged): our tensor-core kernels where they serve (no dropout).
    const bool ranged = !p.plain();
    if (ranged ? p.B * p.Hkv * p.keys() == 0 : p.B * p.Hq * p.S == 0) return;
    const void* ptrs[] = {q, k, v, out, lse, dout, dq, dk, dv};
    if (!ranged && attention_use_cudnn(p, true, ptrs, 9)) {  // --attention-backend (attention_cudnn.h)
      cudnn_attention_backward(p, q, k, v, out, lse, dout, dq, dk, dv, s, attention_deterministic());
      return;
    }
    if (ranged && attention_use_cudnn_varlen(p, true, ptrs, 9)) {  // packed documents on cuDNN
      cudnn_attention_varlen_backward(p, q, k, v, out, lse, dout, dq, dk, dv, s, attention_deterministic());
      return;
    }
    if ((ranged && p.dropout_p > 0.f) || !attention_uses_tensor_cores(p) || !aligned16(q) || !aligned16(k) ||
        !aligned16(v) || !aligned16(dout) || !aligned16(dq)) {
      attention_backward_generic(p, q, k, v, out, lse, dout, dq, dk, dv, s);
      return;
    }
    if (p.S == 0) {  // ranged, no query reaches a key
      MT_CUDA_CHECK(cudaMemsetAsync(dk, 0, static_cast<size_t>(p.B * p.Hkv * p.keys() * p.D) * sizeof(bf16), s));
      MT_CUDA_CHECK(cudaMemsetAsync(dv, 0, static_cast<size_t>(p.B * p.Hkv * p.keys() * p.D) * sizeof(bf16), s));
      return;
    }
    Scratch delta(static_cast<size_t>(p.B * p.Hq * p.S) * sizeof(float), s);
    attention_delta(out, dout, delta.as<float>(), p.B * p.Hq * p.S, p.D, s);
    TcArgs a = make_args(p);
    a.q = q, a.k = k, a.v = v, a.out = out, a.dout = dout, a.lse = lse, a.delta = delta.as<float>();
    a.dq = dq, a.dk = dk, a.dv = dv;
    const bool drop = p.dropout_p > 0.f;
    if (ranged)
      p.D == 64 ? launch_backward<64, false, true>(a, p.B, s) : launch_backward<128, false, true>(a, p.B, s);
    else if (p.D == 64)
      drop ? launch_backward<64, true>(a, p.B, s) : launch_backward<64, false>(a, p.B, s);
    else
      drop ? launch_backward<128, true>(a, p.B, s) : launch_backward<128, false>(a, p.B, s);
  }
}

MT_INSTANTIATE(attention_backward, bf16);
MT_INSTANTIATE(attention_backward, float);

}  // namespace mt::cuda
