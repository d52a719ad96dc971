#pragma once
// Layout kernels between the model's GEMMs (bf16 or fp16 storage, one overload each); see layout.cu.
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
void qkv_split(const bf16* packed, bf16* q, bf16* k, bf16* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
void qkv_split(const f16* packed, f16* q, f16* k, f16* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
// The reverse for gradients: dq and dk rotated back, then packed. q and k may be overwritten
// (the fallback for head dims that are not a multiple of 8 rotates them in place).
void qkv_merge(bf16* q, bf16* k, const bf16* v, bf16* packed, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
void qkv_merge(f16* q, f16* k, const f16* v, f16* packed, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s);
void heads_to_rows(const bf16* heads, bf16* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void heads_to_rows(const f16* heads, f16* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void rows_to_heads(const bf16* rows, bf16* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void rows_to_heads(const f16* rows, f16* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void add_position_embedding(bf16* x, const bf16* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
void add_position_embedding(f16* x, const f16* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
void position_embedding_backward(const bf16* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
void position_embedding_backward(const f16* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
}  // namespace mt::cuda
