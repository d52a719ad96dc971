#pragma once
// Layout kernels between the model's GEMMs (bf16 storage); see layout.cu.
#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {
void qkv_split(const bf16* packed, bf16* q, bf16* k, bf16* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               cudaStream_t s);
void qkv_merge(const bf16* q, const bf16* k, const bf16* v, bf16* packed, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, cudaStream_t s);
void heads_to_rows(const bf16* heads, bf16* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void rows_to_heads(const bf16* rows, bf16* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s);
void add_position_embedding(bf16* x, const bf16* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
void position_embedding_backward(const bf16* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s);
}  // namespace mt::cuda
