#pragma once
// The GEMV's per-warp pieces (gemv.cu says what the kernel does and why), shared by gemv.cu's
// kernels and decode_stack.cu's whole-stack decode kernel, so that both compute the same bits:
// the weight loads, the norm fusion's rstd, the epilogues (plain with bias and residual, SwiGLU,
// QKV with RoPE into the KV cache) and which weight rows a work item reads.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda::gemv {

// The weights are read exactly once: a streaming load that does not allocate in L1, leaving it
// to x, which every warp of the SM reads.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The norm fusion's longest row (gemv_fusable says why).
constexpr int64_t kNormMaxK = 32 * 16 * 8;

template <typename T>
__device__ __forceinline__ float rounded(float v) {  // v as stored in T and read back
  return to_f(from_f<T>(v));
}

// rmsnorm_forward's rstd of the row xr (dim elements, dim % 8 == 0, 16-byte aligned), summed in
// the order of norms.cu's one-warp kernel: lane l takes vectors l, l + 32, ..., each element in
// turn, then the same butterfly: the same bits.
template <typename T>
__device__ __forceinline__ float row_rstd(const T* xr, int64_t dim, float eps, int lane) {
  constexpr int V = Vec<T>::N;
  float acc = 0.f;
  for (int64_t vi = lane; vi < dim / V; vi += 32) {
    float v[V];
    Vec<T>::load(xr + vi * V, v);
#pragma unroll
    for (int e = 0; e < V; ++e) acc += v[e] * v[e];
  }
  acc = warp_sum(acc);
  const float inv_dim = 1.f / static_cast<float>(dim);
  return 1.f / sqrtf(acc * inv_dim + eps);
}

// One round of a warp's weight loads, every load issued before any is used: U 16-byte chunks per
// lane of each of its R rows (the first R of raw's RA), from chunk c0 on (zeros past the row's end
// or for a dead warp).
template <typename TI, int R, int RA, int U>
__device__ __forceinline__ void load_round(uint4 (&raw)[RA][U], const TI* const* wr, int64_t c0, int64_t chunks,
                                           bool live, int lane) {
  static_assert(R <= RA, "raw holds R rows");
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32 + lane;
      raw[r][u] = live && c < chunks ? load_stream(wr[r] + c * Vec<TI>::N) : make_uint4(0, 0, 0, 0);
    }
}

// What a warp's columns become: y's columns (Plain), y = SwiGLU of a gate and an up column
// (SwiGlu), or q and the KV caches' new rows, a column and its RoPE partner (Qkv, GemvQkvOut).
enum class Out { Plain, SwiGlu, Qkv };

// Qkv's epilogue for row m: packed QKV columns c1 (d of its head) and c1 + D/2 as linear_qkv's
// output stores them, rotated as qkv_split rotates q and k (layout.cu's rope_chunk pairs d with
// d + D/2 through rope_pair), written where qkv_split_to_cache puts them: q [1, G*qpg, M, D], k
// and v at the row's (slot, position) of the caches (a row outside the cache is skipped).
template <typename T>
__device__ __forceinline__ void qkv_store(const GemvQkvOut& o, const T* b, int64_t c1, float s1, float s2, int m,
                                          int M) {
  const int D = o.D, half = D / 2, heads = o.qpg + 2;  // heads per group: qpg of q, k, v
  const int64_t hd = c1 / D;
  const int d = static_cast<int>(c1 - hd * D), g = static_cast<int>(hd / heads), j = static_cast<int>(hd % heads);
  if (b) s1 += to_f(b[c1]), s2 += to_f(b[c1 + half]);
  float x1 = rounded<T>(s1), x2 = rounded<T>(s2);
  if (j <= o.qpg && o.cos) {
    float o1, o2;
    rope_pair(x1, x2, o.cos[static_cast<int64_t>(m) * half + d], o.sin[static_cast<int64_t>(m) * half + d], o1, o2);
    x1 = o1, x2 = o2;
  }
  T* dst;
  if (j < o.qpg) {
    dst = static_cast<T*>(o.q) + ((static_cast<int64_t>(g) * o.qpg + j) * M + m) * D;
  } else {
    const int64_t s = o.slot[m], p = o.pos[m];
    if (s < 0 || s >= o.slots || p < 0 || p >= o.L) return;
    dst = static_cast<T*>(j == o.qpg ? o.k_cache : o.v_cache) + ((s * o.G + g) * o.L + p) * D;
  }
  dst[d] = from_f<T>(x1);
  dst[d + half] = from_f<T>(x2);
}

// A work item's outputs from its columns' sums (every lane holds them after the warp's butterfly;
// lane m writes row m): y's column n (Plain), SwiGLU of gate n and up n + cols (SwiGlu), or the
// packed QKV column c0 and its RoPE partner through qkv_store (Qkv).
template <typename TO, int MR, Out OUT, int R>
__device__ __forceinline__ void store_item(const float (&sum)[R][MR], int64_t n, int64_t c0, int64_t cols, int64_t N,
                                           const TO* b, const TO* residual, TO* y, const GemvQkvOut& qkv, int M,
                                           int lane) {
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    if (m >= M) break;
    if (lane != m % 32) continue;
    if constexpr (OUT == Out::SwiGlu) {  // fc1's two outputs as stored, then SwiGLU's, as elementwise.cu computes it
      float g = sum[0][m], up = sum[1][m];
      if (b) g += to_f(b[n]), up += to_f(b[n + cols]);
      y[m * cols + n] = from_f<TO>(swiglu_value(rounded<TO>(g), rounded<TO>(up)));
    } else if constexpr (OUT == Out::Qkv) {
      qkv_store<TO>(qkv, b, c0, sum[0][m], sum[R - 1][m], m, M);
    } else {
      float v = sum[0][m];
      if (b) v += to_f(b[n]);
      // Through L2 (not L1): decode_stack.cu's kernel updates the residual stream in place while
      // it runs, and an L1 line from an earlier layer would be stale.
      if (residual) v += to_f(__ldcg(residual + m * N + n));
      y[m * N + n] = from_f<TO>(v);
    }
  }
}

// The weight rows of work item n: n; or gate n and up n + cols (SwiGlu); or, in the packed QKV
// row, column d of head hd and its RoPE partner d + D/2 (Qkv: n = hd * D/2 + d).
template <Out OUT, int R>
__device__ __forceinline__ void item_rows(int64_t n, int64_t cols, const GemvQkvOut& qkv, int64_t (&col)[R]) {
  if constexpr (OUT == Out::Qkv) {
    const int64_t half = qkv.D / 2, hd = n / half;
    col[0] = hd * qkv.D + (n - hd * half);
    col[R - 1] = col[0] + half;
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) col[r] = n + r * cols;
  }
}

}  // namespace mt::cuda::gemv
