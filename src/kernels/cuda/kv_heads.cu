// Grouped-query attention's key/value heads spread over the query heads and summed back: the
// cuDNN backward can run a GQA call as plain multi-head attention (attention_cudnn.h), whose
// deterministic engine is faster than its grouped one. Query head h reads key/value head
// h / group, as everywhere in the attention code.
#include "core/error.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int N = Vec<bf16>::N;

// dst[b, h] = src[b, h / group], one 16-byte vector per thread (grid-stride).
__global__ void repeat_kv_kernel(const bf16* __restrict__ src, bf16* __restrict__ dst, int64_t Hkv, int64_t group,
                                 int64_t row_vecs, int64_t total_vecs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, col = i % row_vecs;  // row = b * Hq + h
    const int64_t b = row / (Hkv * group), h = row % (Hkv * group);
    const int64_t src_row = b * Hkv + h / group;
    *reinterpret_cast<uint4*>(dst + i * N) =
        *reinterpret_cast<const uint4*>(src + (src_row * row_vecs + col) * N);
  }
}

// dst[b, g] = sum over j < group of src[b, g * group + j], in fp32 in j order, rounded once.
__global__ void sum_groups_kernel(const bf16* __restrict__ src, bf16* __restrict__ dst, int64_t group,
                                  int64_t row_vecs, int64_t total_vecs) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs, col = i % row_vecs;  // row = b * Hkv + g
    float acc[N] = {};
    for (int64_t j = 0; j < group; ++j) {
      float v[N];
      Vec<bf16>::load(src + ((row * group + j) * row_vecs + col) * N, v);
#pragma unroll
      for (int e = 0; e < N; ++e) acc[e] += v[e];
    }
    Vec<bf16>::store(dst + i * N, acc);
  }
}

void check_rows(const void* a, const void* b, int64_t row_elems) {
  MT_CHECK(row_elems % N == 0 && aligned16(a) && aligned16(b),
           "key/value head copies need rows of a multiple of {} elements and 16-byte aligned buffers (row {})", N,
           row_elems);
}

}  // namespace

void repeat_kv_heads(const bf16* src, bf16* dst, int64_t B, int64_t Hkv, int64_t group, int64_t row_elems,
                     cudaStream_t s) {
  check_rows(src, dst, row_elems);
  const int64_t total = B * Hkv * group * (row_elems / N);
  if (total == 0) return;
  repeat_kv_kernel<<<grid_for(total, kThreads), kThreads, 0, s>>>(src, dst, Hkv, group, row_elems / N, total);
  MT_CUDA_LAUNCH_CHECK();
}

void sum_kv_head_groups(const bf16* src, bf16* dst, int64_t B, int64_t Hkv, int64_t group, int64_t row_elems,
                        cudaStream_t s) {
  check_rows(src, dst, row_elems);
  const int64_t total = B * Hkv * (row_elems / N);
  if (total == 0) return;
  sum_groups_kernel<<<grid_for(total, kThreads), kThreads, 0, s>>>(src, dst, group, row_elems / N, total);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace mt::cuda
