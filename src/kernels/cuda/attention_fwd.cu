// Flash attention forward on tensor cores (bf16 in, fp32 accumulate), head dims 64 and 128.
//
// One CTA per (batch*head, query block of 16*NW rows); each warp owns 16 query rows. Q fragments
// stay in registers; key/value tiles of 64 rows stream through double-buffered, swizzled shared
// memory (cp.async); S = Q K^T and O += P V are mma.m16n8k16 products with the online softmax
// in between, in the exp2 domain. lse (natural log) is saved per row for the backward.
// Causal: key tiles past the block's last row are never loaded, warps skip tiles entirely above
// their rows, and the longest query blocks are launched first (grid y runs them in reverse)
// so that the short ones fill the tail. Dropout (a template flag, so the common no-dropout
// kernel carries none of its code) uses the CPU's Philox key element by element.
// Ranged calls (RANGED, a template flag like DROP; no dropout): a query chunk against a key
// chunk at their positions, and packed documents, where each row sees the keys [lo, hi) of
// row_keys. A block loads only the key tiles between its first row's lo and its last row's hi,
// so a packed sample costs the sum of its documents' triangles, not the whole one.
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

template <int D, int NW, bool DROP, bool RANGED>
__global__ void __launch_bounds__(NW * 32) flash_fwd_kernel(const TcArgs a) {
  static_assert(!(DROP && RANGED), "ranged calls with dropout run the generic kernels");
  constexpr int BR = 16 * NW, BC = 64, KS = D / 16, NT = BC / 8, DT = D / 8;
  using Tile = SwizzledTile<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + BR * D;      // [2][BC][D]
  bf16* sV = sK + 2 * BC * D;  // [2][BC][D]

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int S = a.S, Sk = RANGED ? a.Sk : a.S;
  const int qb = a.causal ? static_cast<int>(gridDim.y - 1 - blockIdx.y) : static_cast<int>(blockIdx.y);
  const int64_t bh = blockIdx.x, b = bh / a.Hq;
  const int64_t bkv = b * a.Hkv + (bh % a.Hq) / a.group;
  const int q0 = qb * BR;
  const bf16* Qg = a.q + (bh * S + q0) * D;
  const bf16* Kg = a.k + bkv * Sk * D;
  const bf16* Vg = a.v + bkv * Sk * D;
  const int wrow0 = q0 + warp * 16;
  const KeyTiles kt = key_tiles<BR, BC, RANGED>(a, b, q0, wrow0);
  const int kb0 = kt.kb0, nkb = kt.nkb, w_lo = kt.w_lo, w_hi = kt.w_hi;

  Tile::template load<NW * 32>(sQ, Qg, BR, min(BR, S - q0));
  {
    const int first = nkb > 0 ? kb0 * BC : 0, valid = nkb > 0 ? min(BC, Sk - first) : 0;
    Tile::template load<NW * 32>(sK, Kg + static_cast<int64_t>(first) * D, BC, valid);
    Tile::template load<NW * 32>(sV, Vg + static_cast<int64_t>(first) * D, BC, valid);
  }
  cp_async_commit();

  uint32_t qf[KS][4];
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int rows[2] = {wrow0 + g, wrow0 + g + 8};
  ops::KeyRange rk[2] = {{0, 0}, {0, 0}};  // ranged: each of the thread's rows' keys
  if constexpr (RANGED)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (rows[r] < S) rk[r] = row_keys(a, b, rows[r]);

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
      if (kv0 >= w_hi || kv0 + BC <= w_lo) continue;  // none of the warp's rows sees these keys
    } else if (a.causal && kv0 > wrow0 + 15) {
      continue;  // this warp's rows see none of these keys
    }
    const bf16* cK = sK + (j & 1) * BC * D;
    const bf16* cV = sV + (j & 1) * BC * D;

    float sc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4(smem_addr(cK + Tile::offset(np * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1))), b0,
                b1, b2, b3);
        mma_bf16(sc[2 * np], qf[ks], b0, b1);
        mma_bf16(sc[2 * np + 1], qf[ks], b2, b3);
      }

    const bool need_mask = RANGED || kv0 + BC > S || (a.causal && kv0 + BC - 1 > wrow0);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = sc[nt][e] * a.scale_log2;
        if (need_mask) {
          const int col = kv0 + nt * 8 + 2 * tq + (e & 1), row = rows[e >> 1];
          if constexpr (RANGED) {
            if (col < rk[e >> 1].lo || col >= rk[e >> 1].hi) s = -INFINITY;
          } else if (col >= S || (a.causal && col > row)) {
            s = -INFINITY;
          }
        }
        sc[nt][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
    float alpha[2], muse[2], rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(m_run[r], mx[r]);
      muse[r] = mnew == -INFINITY ? 0.f : mnew;
      alpha[r] = exp2f(m_run[r] - muse[r]);
      m_run[r] = mnew;
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[nt][e] - muse[e >> 1]);
        rsum[e >> 1] += p;
        sc[nt][e] = p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rsum[r];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
    if constexpr (DROP) {  // the normaliser counts every probability; dropout only changes what reaches V
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = kv0 + nt * 8 + 2 * tq + (e & 1), row = rows[e >> 1];
          if (col < S && row < S) sc[nt][e] *= drop_factor(a, bh, row, col);
        }
    }
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b0, b1, b2, b3;
        ldsm_x4_t(smem_addr(cV + Tile::offset(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4))),
                  b0, b1, b2, b3);
        mma_bf16(o[2 * dp], pa, b0, b1);
        mma_bf16(o[2 * dp + 1], pa, b2, b3);
      }
    }
  }

  if (nkb == 0) {  // no tile was awaited: Q's copy must land before sQ becomes the staging area
    cp_async_wait_all();
    __syncthreads();
  }
  // Epilogue: finish the row sums across the quad, normalise, stage the warp's 16 rows in its
  // own (no longer needed) part of sQ, then store 16-byte chunks (a row that saw no key: zeros,
  // lse +inf).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    inv[r] = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
    if (tq == 0 && rows[r] < S)
      a.lse_out[bh * S + rows[r]] = l_run[r] > 0.f ? m_run[r] * kLn2 + logf(l_run[r]) : INFINITY;
  }
  bf16* stage = sQ;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    *reinterpret_cast<uint32_t*>(stage + Tile::offset(warp * 16 + g, dt) + 2 * tq) =
        pack_bf16(o[dt][0] * inv[0], o[dt][1] * inv[0]);
    *reinterpret_cast<uint32_t*>(stage + Tile::offset(warp * 16 + g + 8, dt) + 2 * tq) =
        pack_bf16(o[dt][2] * inv[1], o[dt][3] * inv[1]);
  }
  __syncwarp();
  for (int idx = lane; idx < 16 * Tile::kChunks; idx += 32) {
    const int r = idx / Tile::kChunks, c = idx % Tile::kChunks;
    if (wrow0 + r < S)
      *reinterpret_cast<uint4*>(a.o + (bh * S + wrow0 + r) * D + c * 8) =
          *reinterpret_cast<const uint4*>(stage + Tile::offset(warp * 16 + r, c));
  }
}

template <int D, bool DROP, bool RANGED = false>
void launch_forward(const TcArgs& a, int64_t B, cudaStream_t s) {
  constexpr int NW = 4, BR = 16 * NW, BC = 64;
  const size_t smem = static_cast<size_t>(BR * D + 4 * BC * D) * sizeof(bf16);
  auto kern = flash_fwd_kernel<D, NW, DROP, RANGED>;
  static const bool once = (set_smem(kern, smem), true);
  (void)once;
  const dim3 grid(static_cast<unsigned>(B * a.Hq), static_cast<unsigned>(ceil_div(a.S, BR)));
  kern<<<grid, NW * 32, smem, s>>>(a);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool attention_uses_tensor_cores(const ops::AttentionShape& p) { return p.D == 64 || p.D == 128; }

// fp32 storage runs the generic kernels; bf16 cuDNN or the tensor-core kernels where they serve.
template <typename T>
void attention_forward(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, nd<T>* out, float* lse,
                       cudaStream_t s) {
  if constexpr (!std::is_same_v<T, bf16>) {
    attention_forward_generic(p, q, k, v, out, lse, s);
  } else {
    check_params(p);
    if (p.B * p.Hq * p.S == 0) return;
    // Chunks and packed documents (ranged): our tensor-core kernel where it serves (no dropout).
    const bool ranged = !p.plain();
    const void* ptrs[] = {q, k, v, out, lse};
    if (!ranged && attention_use_cudnn(p, false, ptrs, 5)) {  // --attention-backend (attention_cudnn.h)
      cudnn_attention_forward(p, q, k, v, out, lse, s);
      return;
    }
    if (ranged && attention_use_cudnn_varlen(p, false, ptrs, 5)) {  // packed documents on cuDNN
      cudnn_attention_varlen_forward(p, q, k, v, out, lse, s);
      return;
    }
    if ((ranged && p.dropout_p > 0.f) || !attention_uses_tensor_cores(p) || !aligned16(q) || !aligned16(k) ||
        !aligned16(v) || !aligned16(out)) {
      attention_forward_generic(p, q, k, v, out, lse, s);
      return;
    }
    TcArgs a = make_args(p);
    a.q = q, a.k = k, a.v = v, a.o = out, a.lse_out = lse;
    const bool drop = p.dropout_p > 0.f;
    if (ranged)
      p.D == 64 ? launch_forward<64, false, true>(a, p.B, s) : launch_forward<128, false, true>(a, p.B, s);
    else if (p.D == 64)
      drop ? launch_forward<64, true>(a, p.B, s) : launch_forward<64, false>(a, p.B, s);
    else
      drop ? launch_forward<128, true>(a, p.B, s) : launch_forward<128, false>(a, p.B, s);
  }
}

MT_INSTANTIATE(attention_forward, bf16);
MT_INSTANTIATE(attention_forward, float);

}  // namespace mt::cuda
