// Layout kernels the model needs between GEMMs: Megatron's packed QKV rows <-> per-head
// tensors, per-head <-> rows, and learned position embeddings. Pure data movement in the
// storage type; one thread per element of the head-side tensor, so stores are coalesced there.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layout.h"

namespace mt::cuda {
namespace {

// packed: [S*B, G*(qpg+2)*D]; q: [B, G*qpg, S, D]; k, v: [B, G, S, D].
template <typename T, bool kToHeads>
__global__ void qkv_kernel(T* packed, T* q, T* k, T* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D) {
  const int64_t per_row = G * (qpg + 2) * D, total = S * B * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, j = (i / D) % (qpg + 2), g = (i / (D * (qpg + 2))) % G, sb = i / per_row;
    const int64_t s = sb / B, b = sb % B;
    T* head = j < qpg ? q + (((b * G + g) * qpg + j) * S + s) * D : (j == qpg ? k : v) + ((b * G + g) * S + s) * D;
    if (kToHeads) head[d] = packed[i];
    else packed[i] = head[d];
  }
}

template <typename T, bool kToRows>
__global__ void heads_rows_kernel(T* heads, T* rows, int64_t S, int64_t B, int64_t H, int64_t D) {
  const int64_t total = S * B * H * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, h = (i / D) % H, b = (i / (D * H)) % B, s = i / (D * H * B);
    T* x = heads + ((b * H + h) * S + s) * D + d;
    if (kToRows) rows[i] = *x;
    else *x = rows[i];
  }
}

template <typename T>
__global__ void add_pos_kernel(T* x, const T* pe, int64_t S, int64_t B, int64_t h) {
  const int64_t total = S * B * h;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % h, s = i / (h * B);
    x[i] = from_f<T>(to_f(x[i]) + to_f(pe[s * h + c]));
  }
}

// dpe[s, c] += sum over b of dx[s*B + b, c], b in increasing order (deterministic).
template <typename T>
__global__ void pos_backward_kernel(const T* dx, float* dpe, int64_t S, int64_t B, int64_t h) {
  const int64_t total = S * h;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % h, s = i / h;
    float acc = 0.f;
    for (int64_t b = 0; b < B; ++b) acc += to_f(dx[(s * B + b) * h + c]);
    dpe[i] += acc;
  }
}

constexpr int kThreads = 256;

}  // namespace

void qkv_split(const bf16* packed, bf16* q, bf16* k, bf16* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               cudaStream_t s) {
  const int64_t n = S * B * G * (qpg + 2) * D;
  qkv_kernel<bf16, true><<<grid_for(n, kThreads), kThreads, 0, s>>>(const_cast<bf16*>(packed), q, k, v, S, B, G, qpg, D);
  MT_CUDA_LAUNCH_CHECK();
}

void qkv_merge(const bf16* q, const bf16* k, const bf16* v, bf16* packed, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, cudaStream_t s) {
  const int64_t n = S * B * G * (qpg + 2) * D;
  qkv_kernel<bf16, false><<<grid_for(n, kThreads), kThreads, 0, s>>>(packed, const_cast<bf16*>(q), const_cast<bf16*>(k),
                                                                      const_cast<bf16*>(v), S, B, G, qpg, D);
  MT_CUDA_LAUNCH_CHECK();
}

void heads_to_rows(const bf16* heads, bf16* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s) {
  heads_rows_kernel<bf16, true><<<grid_for(S * B * H * D, kThreads), kThreads, 0, s>>>(const_cast<bf16*>(heads), rows,
                                                                                        S, B, H, D);
  MT_CUDA_LAUNCH_CHECK();
}

void rows_to_heads(const bf16* rows, bf16* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s) {
  heads_rows_kernel<bf16, false><<<grid_for(S * B * H * D, kThreads), kThreads, 0, s>>>(heads, const_cast<bf16*>(rows),
                                                                                         S, B, H, D);
  MT_CUDA_LAUNCH_CHECK();
}

void add_position_embedding(bf16* x, const bf16* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s) {
  add_pos_kernel<bf16><<<grid_for(S * B * h, kThreads), kThreads, 0, s>>>(x, pe, S, B, h);
  MT_CUDA_LAUNCH_CHECK();
}

void position_embedding_backward(const bf16* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s) {
  pos_backward_kernel<bf16><<<grid_for(S * h, kThreads), kThreads, 0, s>>>(dx, dpe, S, B, h);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
