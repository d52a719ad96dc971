// Softmax cross-entropy without a probability tensor. Forward: one block per row, each thread
// keeps an online (max, sum of exp) over its 16-byte vectors, and the pairs are merged in a fixed
// tree (warp butterfly, then warps in order): deterministic. Backward: one block per row
// recomputes exp(x - lse) and writes the gradient over the logits (in place allowed).
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 512;

struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

template <typename T>
__global__ void ce_fwd_kernel(const T* __restrict__ logits, const int32_t* __restrict__ targets,
                              float* __restrict__ losses, float* __restrict__ lse, int64_t V, int64_t valid_v,
                              bool vec) {
  constexpr int N = Vec<T>::N;
  __shared__ MaxSum sh[32];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * V;
  MaxSum acc{-INFINITY, 0.f};
  for (int64_t j0 = threadIdx.x * N; j0 < valid_v; j0 += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    const int cnt = valid_v - j0 < N ? static_cast<int>(valid_v - j0) : N;
    if (vec && cnt == N) {
      Vec<T>::load(row + j0, v);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) v[e] = e < cnt ? to_f(row[j0 + e]) : -INFINITY;
    }
    float vm = v[0];
#pragma unroll
    for (int e = 1; e < N; ++e) vm = fmaxf(vm, v[e]);
    const float m = fmaxf(acc.m, vm);
    float s = acc.s * __expf(acc.m - m);  // acc.m = -inf at first: exp(-inf) = 0
#pragma unroll
    for (int e = 0; e < N; ++e) s += __expf(v[e] - m);
    acc = {m, s};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
    acc = merge(acc, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum t = sh[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) t = merge(t, sh[w]);
    const float l = t.m + logf(t.s);
    lse[r] = l;
    losses[r] = l - to_f(row[targets[r]]);
  }
}

// No __restrict__: dlogits may be logits.
template <typename T>
__global__ void ce_bwd_kernel(const T* logits, const int32_t* __restrict__ targets, const float* __restrict__ lse,
                              const float* __restrict__ dloss, T* dlogits, int64_t V, int64_t valid_v, bool vec) {
  constexpr int N = Vec<T>::N;
  const int64_t r = blockIdx.x;
  const float g = dloss[r], l = lse[r];
  const int64_t t = targets[r];
  const T* row = logits + r * V;
  T* drow = dlogits + r * V;
  for (int64_t j0 = threadIdx.x * N; j0 < V; j0 += static_cast<int64_t>(blockDim.x) * N) {
    const int cnt = V - j0 < N ? static_cast<int>(V - j0) : N;
    float v[N], o[N];
    if (vec && cnt == N) {
      Vec<T>::load(row + j0, v);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e)
        if (e < cnt) v[e] = to_f(row[j0 + e]);
    }
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t j = j0 + e;
      o[e] = j < valid_v ? g * __expf(v[e] - l) : 0.f;
      if (j == t) o[e] -= g;
    }
    if (vec && cnt == N) {
      Vec<T>::store(drow + j0, o);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e)
        if (e < cnt) drow[j0 + e] = from_f<T>(o[e]);
    }
  }
}

template <typename T>
void ce_fwd(const T* logits, const int32_t* targets, float* losses, float* lse, int64_t N, int64_t V, int64_t valid_v,
            cudaStream_t s) {
  MT_CHECK(valid_v > 0 && valid_v <= V, "cross entropy: valid_v {} outside (0, {}]", valid_v, V);
  if (N == 0) return;
  const bool vec = V % Vec<T>::N == 0 && aligned16(logits);
  ce_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(logits, targets, losses, lse, V, valid_v, vec);
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void ce_bwd(const T* logits, const int32_t* targets, const float* lse, const float* dloss, T* dlogits, int64_t N,
            int64_t V, int64_t valid_v, cudaStream_t s) {
  if (N == 0) return;
  const bool vec = V % Vec<T>::N == 0 && aligned16(logits) && aligned16(dlogits);
  ce_bwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, s>>>(logits, targets, lse, dloss, dlogits, V, valid_v, vec);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void cross_entropy_forward(const bf16* logits, const int32_t* targets, float* losses, float* lse, int64_t N, int64_t V,
                           int64_t valid_v, cudaStream_t s) {
  ce_fwd(logits, targets, losses, lse, N, V, valid_v, s);
}
void cross_entropy_forward(const f16* logits, const int32_t* targets, float* losses, float* lse, int64_t N, int64_t V,
                           int64_t valid_v, cudaStream_t s) {
  ce_fwd(logits, targets, losses, lse, N, V, valid_v, s);
}
void cross_entropy_forward(const float* logits, const int32_t* targets, float* losses, float* lse, int64_t N, int64_t V,
                           int64_t valid_v, cudaStream_t s) {
  ce_fwd(logits, targets, losses, lse, N, V, valid_v, s);
}
void cross_entropy_backward(const bf16* logits, const int32_t* targets, const float* lse, const float* dloss,
                            bf16* dlogits, int64_t N, int64_t V, int64_t valid_v, cudaStream_t s) {
  ce_bwd(logits, targets, lse, dloss, dlogits, N, V, valid_v, s);
}
void cross_entropy_backward(const f16* logits, const int32_t* targets, const float* lse, const float* dloss,
                            f16* dlogits, int64_t N, int64_t V, int64_t valid_v, cudaStream_t s) {
  ce_bwd(logits, targets, lse, dloss, dlogits, N, V, valid_v, s);
}
void cross_entropy_backward(const float* logits, const int32_t* targets, const float* lse, const float* dloss,
                            float* dlogits, int64_t N, int64_t V, int64_t valid_v, cudaStream_t s) {
  ce_bwd(logits, targets, lse, dloss, dlogits, N, V, valid_v, s);
}

}  // namespace mt::cuda
