#pragma once
// Shared pieces of the tensor-core flash-attention kernels (attention_fwd.cu, attention_bwd.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "kernels/attention_shape.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"

namespace mt::cuda::attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct TcArgs {
  const bf16 *q, *k, *v, *out, *dout;
  bf16 *o, *dq, *dk, *dv;
  float* lse_out;
  const float *lse, *delta;
  int S, Hq, Hkv, group;
  float scale, scale_log2;
  bool causal;
  float dropout_p, keep_scale;
  uint64_t seed, offset;
  // Ranged calls (the kernels' RANGED form: chunks at positions, packed documents): Sk keys per
  // head, and the whole call's shape, whose visible_keys gives each query row its keys [lo, hi).
  // Plain calls leave Sk = S and never read shape.
  int Sk;
  ops::AttentionShape shape;
};

// The keys query row i of sample b sees (ranged calls). Both ends rise with i (a row's
// document starts no earlier, and its causal end no earlier, than the previous row's), so the
// kernels bound a block of rows by its first row's lo and its last row's hi.
__device__ __forceinline__ ops::KeyRange row_keys(const TcArgs& a, int64_t b, int i) {
  return ops::visible_keys(a.shape, b, i);
}

// Dropout factor (0 or 1/(1-p)) of probability (query i, key j) of head bh: the CPU's key.
__device__ __forceinline__ float drop_factor(const TcArgs& a, int64_t bh, int i, int j) {
  const uint64_t idx = (static_cast<uint64_t>(bh) * a.S + i) * a.S + j;
  return philox_uniform(a.seed, a.offset, idx) >= a.dropout_p ? a.keep_scale : 0.f;
}

// The key tiles (of BC keys) a block of BR query rows from q0 walks, kb0 .. kb0 + nkb - 1, and
// the keys [w_lo, w_hi) that the warp's 16 rows from wrow0 see at most (ranged calls only; the
// plain ones skip tiles by the causal diagonal). Plain: every tile up to the block's diagonal
// (causal) or the last.
struct KeyTiles {
  int kb0, nkb, w_lo, w_hi;
};
template <int BR, int BC, bool RANGED>
__device__ __forceinline__ KeyTiles key_tiles(const TcArgs& a, int64_t b, int q0, int wrow0) {
  KeyTiles t{0, 0, 0, 0};
  const int S = a.S;
  if constexpr (RANGED) {
    const int kv_begin = static_cast<int>(row_keys(a, b, q0).lo);
    const int kv_end = static_cast<int>(row_keys(a, b, min(q0 + BR, S) - 1).hi);
    t.kb0 = kv_begin / BC;
    t.nkb = kv_end > kv_begin ? (kv_end + BC - 1) / BC - t.kb0 : 0;
    if (wrow0 < S) {
      t.w_lo = static_cast<int>(row_keys(a, b, wrow0).lo);
      t.w_hi = static_cast<int>(row_keys(a, b, min(wrow0 + 15, S - 1)).hi);
    }
  } else {
    const int kv_end = a.causal ? min(S, q0 + BR) : S;
    t.nkb = (kv_end + BC - 1) / BC;
  }
  return t;
}

inline TcArgs make_args(const ops::AttentionShape& p) {
  TcArgs a{};
  a.S = static_cast<int>(p.S);
  a.Sk = static_cast<int>(p.keys());
  a.shape = p;
  a.Hq = static_cast<int>(p.Hq);
  a.Hkv = static_cast<int>(p.Hkv);
  a.group = static_cast<int>(p.Hq / p.Hkv);
  a.scale = p.scale;
  a.scale_log2 = p.scale * kLog2e;
  a.causal = p.causal;
  a.dropout_p = p.dropout_p;
  a.keep_scale = p.dropout_p < 1.f ? 1.f / (1.f - p.dropout_p) : 0.f;
  a.seed = p.seed;
  a.offset = p.offset;
  return a;
}

inline void check_params(const ops::AttentionShape& p) {
  MT_CHECK(p.B >= 0 && p.S >= 0 && p.D > 0 && p.Hkv > 0 && p.Hq > 0 && p.Hq % p.Hkv == 0,
           "bad attention shape B={} Hq={} Hkv={} S={} D={}", p.B, p.Hq, p.Hkv, p.S, p.D);
  MT_CHECK(p.S < (int64_t{1} << 31) && p.S / 16 < 65535 && p.B * p.Hq < (int64_t{1} << 31),
           "attention shape too large for the GPU grid (B={} Hq={} S={})", p.B, p.Hq, p.S);
  MT_CHECK(p.keys() >= 0 && p.keys() < (int64_t{1} << 31) && p.keys() / 16 < 65535 && p.q_pos >= 0 && p.k_pos >= 0 &&
               (p.cu_seqlens == nullptr || p.num_segments > 0),
           "bad attention chunk Sk={} q_pos={} k_pos={} segments={}", p.keys(), p.q_pos, p.k_pos, p.num_segments);
}

// Opts a kernel into more than 48 KB of dynamic shared memory (once per kernel).
template <typename K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace mt::cuda::attn
