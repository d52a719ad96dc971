#pragma once
// Layout kernels between the model's GEMMs, instantiated for the half types (bf16, fp16); see layout.cu.
#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {
// Rotary embedding fused into the QKV split/merge: rotate-half over the first rot_dim of every
// q and k head, fp32 tables [S, rot_dim/2]. rot_dim 0: none.
struct RopeArgs {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t rot_dim = 0;
};
// packed [S*B, G*(qpg+2)*D] -> q [B, G*qpg, S, D], k/v [B, G, S, D], q and k rotated.
template <typename T>
void qkv_split(const T* packed, nd<T>* q, nd<T>* k, nd<T>* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
// ops::qkv_split_to_cache's one kernel: packed [N, G*(qpg+2)*D] -> q [1, G*qpg, N, D] (rotated),
// k (rotated) and v into the caches [slots, G, L, D] at (slot[i], pos[i]); rows outside the cache
// are skipped (the host checked them). Returns false, having done nothing, where the 16-byte path
// does not apply (the caller composes qkv_split and kv_cache_write).
template <typename T>
bool qkv_split_to_cache(const T* packed, nd<T>* q, nd<T>* k_cache, nd<T>* v_cache, const int32_t* slot,
                        const int32_t* pos, int64_t N, int64_t G, int64_t qpg, int64_t D, int64_t slots, int64_t L,
                        const RopeArgs& rope, cudaStream_t s);
// The reverse for gradients: dq and dk rotated back, then packed. q and k may be overwritten
// (the fallback for head dims that are not a multiple of 8 rotates them in place).
template <typename T>
void qkv_merge(T* q, nd<T>* k, const nd<T>* v, nd<T>* packed, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
template <typename T>
void heads_to_rows(const T* heads, nd<T>* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
template <typename T>
void rows_to_heads(const T* rows, nd<T>* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
template <typename T>
void add_position_embedding(T* x, const nd<T>* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
template <typename T>
void position_embedding_backward(const T* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
}  // namespace mt::cuda
