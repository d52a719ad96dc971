// Layout kernels the model needs between GEMMs: Megatron's packed QKV rows <-> per-head
// tensors (with RoPE fused in: the split rotates q and k on the way, the merge rotates their
// gradients back), per-head <-> rows, and learned position embeddings.
//
// Fast path: a thread moves one 16-byte chunk (8 bf16 or fp16) of a head row; blockIdx.y walks token
// rows (s*B + b) and threads the chunks of a row, so index math is a few 32-bit divisions by
// launch constants. (One thread per element with 64-bit div/mod, the fallback below for head
// dims that are not a multiple of 8, is instruction-bound at several times the copy's time.)
#include <algorithm>
#include <initializer_list>

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

constexpr int kVecThreads = 128;
constexpr int kChunk = 8;  // bf16 or fp16 values per 16-byte chunk
static_assert(Vec<bf16>::N == kChunk && Vec<f16>::N == kChunk, "a chunk is one 16-byte vector");

dim3 row_chunk_grid(int64_t rows, int64_t chunks) {
  return dim3(static_cast<unsigned>((chunks + kVecThreads - 1) / kVecThreads),
              static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
}

// Rotate-half RoPE of one 8-element chunk x at d0 of a head row whose other half-chunk is y:
// element i < half pairs with i + half. sign -1 rotates back (the gradient).
__device__ __forceinline__ void rope_chunk(float* x, const float* y, int d0, int half, const float* cs,
                                           const float* sn, float sign) {
  const bool first = d0 < half;
  const int i0 = first ? d0 : d0 - half;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) {
    const float c = cs[i0 + e], si = sign * sn[i0 + e];
    float o1, o2;
    if (first) rope_pair(x[e], y[e], c, si, o1, o2);
    else rope_pair(y[e], x[e], c, si, o1, o2);
    x[e] = first ? o1 : o2;
  }
}

// packed: [S*B, G*(qpg+2)*D]; q: [B, G*qpg, S, D]; k, v: [B, G, S, D]. half > 0: RoPE on q and
// k over the first 2*half of each head, tables [S, half].
template <typename T, bool kToHeads>
__global__ void qkv_vec_kernel(T* packed, T* q, T* k, T* v, int S, int B, int G, int qpg, int D,
                               const float* cs, const float* sn, int half, float sign) {
  const int cph = D / kChunk, per_group = (qpg + 2) * cph, chunks = G * per_group;
  for (int row = blockIdx.y; row < S * B; row += gridDim.y) {
    const int s = row / B, b = row - s * B;
    T* prow = packed + static_cast<int64_t>(row) * chunks * kChunk;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
      const int g = c / per_group, jc = c - g * per_group, j = jc / cph, d0 = (jc - j * cph) * kChunk;
      T* head = j < qpg ? q + ((static_cast<int64_t>(b) * G + g) * qpg + j) * S * D
                           : (j == qpg ? k : v) + (static_cast<int64_t>(b) * G + g) * S * D;
      head += static_cast<int64_t>(s) * D;
      T* phead = prow + (c - d0 / kChunk) * kChunk;  // this head's D values in the packed row
      const T* src = kToHeads ? phead : head;
      T* dst = kToHeads ? head : phead;
      float x[kChunk];
      Vec<T>::load(src + d0, x);
      if (j <= qpg && d0 < 2 * half) {
        float y[kChunk];
        Vec<T>::load(src + (d0 < half ? d0 + half : d0 - half), y);
        rope_chunk(x, y, d0, half, cs + static_cast<int64_t>(s) * half, sn + static_cast<int64_t>(s) * half, sign);
      }
      Vec<T>::store(dst + d0, x);
    }
  }
}

// qkv_vec_kernel's split of N = S rows (B = 1) with k and v written into the KV caches at the
// rows' (slot, position) instead of [1, G, N, D] tensors: decode's split and cache write in one
// kernel (ops::qkv_split_to_cache). Rows outside the cache are skipped (the host checked them).
template <typename T>
__global__ void qkv_cache_vec_kernel(const T* packed, T* q, T* kc, T* vc, const int32_t* slot, const int32_t* pos,
                                     int N, int G, int qpg, int D, int64_t slots, int64_t L, const float* cs,
                                     const float* sn, int half) {
  const int cph = D / kChunk, per_group = (qpg + 2) * cph, chunks = G * per_group;
  const int row = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const int g = c / per_group, jc = c - g * per_group, j = jc / cph, d0 = (jc - j * cph) * kChunk;
  const T* phead = packed + static_cast<int64_t>(row) * chunks * kChunk + (c - d0 / kChunk) * kChunk;
  float x[kChunk];
  Vec<T>::load(phead + d0, x);
  if (j <= qpg && d0 < 2 * half) {
    float y[kChunk];
    Vec<T>::load(phead + (d0 < half ? d0 + half : d0 - half), y);
    rope_chunk(x, y, d0, half, cs + static_cast<int64_t>(row) * half, sn + static_cast<int64_t>(row) * half, 1.f);
  }
  T* dst;
  if (j < qpg) {
    dst = q + ((static_cast<int64_t>(g) * qpg + j) * N + row) * D;
  } else {
    const int64_t s = slot[row], p = pos[row];
    if (s < 0 || s >= slots || p < 0 || p >= L) return;
    dst = (j == qpg ? kc : vc) + ((s * G + g) * L + p) * D;
  }
  Vec<T>::store(dst + d0, x);
}

template <typename T, bool kToRows>
__global__ void heads_rows_vec_kernel(T* heads, T* rows, int S, int B, int H, int D) {
  const int cph = D / kChunk, chunks = H * cph;
  for (int row = blockIdx.y; row < S * B; row += gridDim.y) {
    const int s = row / B, b = row - s * B;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
      const int h = c / cph, d0 = (c - h * cph) * kChunk;
      uint4* hp = reinterpret_cast<uint4*>(heads + ((static_cast<int64_t>(b) * H + h) * S + s) * D + d0);
      uint4* rp = reinterpret_cast<uint4*>(rows + static_cast<int64_t>(row) * chunks * kChunk + c * kChunk);
      if (kToRows) *rp = *hp;
      else *hp = *rp;
    }
  }
}

// blockIdx.y walks token rows (s*B + b), threads the hidden dim: no per-element division.
template <typename T>
__global__ void add_pos_kernel(T* x, const T* pe, int64_t S, int64_t B, int64_t h) {
  for (int64_t row = blockIdx.y; row < S * B; row += gridDim.y) {
    T* xr = x + row * h;
    const T* pr = pe + (row / B) * h;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < h; c += int64_t(gridDim.x) * blockDim.x)
      xr[c] = from_f<T>(to_f(xr[c]) + to_f(pr[c]));
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

namespace {
// The 16-byte path needs whole chunks per head (and per RoPE half), aligned buffers and sizes
// that fit the kernels' 32-bit index math.
bool vec_layout_ok(int64_t rows, int64_t row_elems, int64_t D, int64_t half, std::initializer_list<const void*> ptrs) {
  if (D % kChunk != 0 || half % kChunk != 0 || rows * row_elems >= (int64_t{1} << 31)) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}
}  // namespace

template <typename T>
void qkv_split(const T* packed, nd<T>* q, nd<T>* k, nd<T>* v, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s) {
  const int64_t rows = S * B, per_row = G * (qpg + 2) * D, half = rope.rot_dim / 2;
  if (rows * per_row == 0) return;
  if (vec_layout_ok(rows, per_row, D, half, {packed, q, k, v})) {
    qkv_vec_kernel<T, true><<<row_chunk_grid(rows, per_row / kChunk), kVecThreads, 0, s>>>(
        const_cast<T*>(packed), q, k, v, static_cast<int>(S), static_cast<int>(B), static_cast<int>(G),
        static_cast<int>(qpg), static_cast<int>(D), rope.cos, rope.sin, static_cast<int>(half), 1.f);
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  qkv_kernel<T, true><<<grid_for(rows * per_row, kThreads), kThreads, 0, s>>>(const_cast<T*>(packed), q, k, v, S, B,
                                                                              G, qpg, D);
  MT_CUDA_LAUNCH_CHECK();
  if (rope.rot_dim > 0) {
    rope_forward(q, rope.cos, rope.sin, B, G * qpg, S, D, rope.rot_dim, s);
    rope_forward(k, rope.cos, rope.sin, B, G, S, D, rope.rot_dim, s);
  }
}

template <typename T>
bool qkv_split_to_cache(const T* packed, nd<T>* q, nd<T>* k_cache, nd<T>* v_cache, const int32_t* slot,
                        const int32_t* pos, int64_t N, int64_t G, int64_t qpg, int64_t D, int64_t slots, int64_t L,
                        const RopeArgs& rope, cudaStream_t s) {
  const int64_t per_row = G * (qpg + 2) * D, half = rope.rot_dim / 2;
  if (!vec_layout_ok(N, per_row, D, half, {packed, q, k_cache, v_cache}) || N > 65535) return false;
  if (N == 0) return true;
  qkv_cache_vec_kernel<T><<<row_chunk_grid(N, per_row / kChunk), kVecThreads, 0, s>>>(
      packed, q, k_cache, v_cache, slot, pos, static_cast<int>(N), static_cast<int>(G), static_cast<int>(qpg),
      static_cast<int>(D), slots, L, rope.cos, rope.sin, static_cast<int>(half));
  MT_CUDA_LAUNCH_CHECK();
  return true;
}

template <typename T>
void qkv_merge(T* q, nd<T>* k, const nd<T>* v, nd<T>* packed, int64_t S, int64_t B, int64_t G, int64_t qpg, int64_t D,
               const RopeArgs& rope, cudaStream_t s) {
  const int64_t rows = S * B, per_row = G * (qpg + 2) * D, half = rope.rot_dim / 2;
  if (rows * per_row == 0) return;
  if (vec_layout_ok(rows, per_row, D, half, {packed, q, k, v})) {
    qkv_vec_kernel<T, false><<<row_chunk_grid(rows, per_row / kChunk), kVecThreads, 0, s>>>(
        packed, q, k, const_cast<T*>(v), static_cast<int>(S), static_cast<int>(B), static_cast<int>(G),
        static_cast<int>(qpg), static_cast<int>(D), rope.cos, rope.sin, static_cast<int>(half), -1.f);
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  if (rope.rot_dim > 0) {  // the fallback rotates the gradients in place first
    rope_backward(q, rope.cos, rope.sin, B, G * qpg, S, D, rope.rot_dim, s);
    rope_backward(k, rope.cos, rope.sin, B, G, S, D, rope.rot_dim, s);
  }
  qkv_kernel<T, false><<<grid_for(rows * per_row, kThreads), kThreads, 0, s>>>(packed, q, k, const_cast<T*>(v), S, B,
                                                                               G, qpg, D);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void heads_to_rows(const T* heads, nd<T>* rows, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s) {
  if (S * B * H * D == 0) return;
  if (vec_layout_ok(S * B, H * D, D, 0, {heads, rows})) {
    heads_rows_vec_kernel<T, true><<<row_chunk_grid(S * B, H * D / kChunk), kVecThreads, 0, s>>>(
        const_cast<T*>(heads), rows, static_cast<int>(S), static_cast<int>(B), static_cast<int>(H),
        static_cast<int>(D));
  } else {
    heads_rows_kernel<T, true><<<grid_for(S * B * H * D, kThreads), kThreads, 0, s>>>(const_cast<T*>(heads), rows, S,
                                                                                       B, H, D);
  }
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void rows_to_heads(const T* rows, nd<T>* heads, int64_t S, int64_t B, int64_t H, int64_t D, cudaStream_t s) {
  if (S * B * H * D == 0) return;
  if (vec_layout_ok(S * B, H * D, D, 0, {heads, rows})) {
    heads_rows_vec_kernel<T, false><<<row_chunk_grid(S * B, H * D / kChunk), kVecThreads, 0, s>>>(
        heads, const_cast<T*>(rows), static_cast<int>(S), static_cast<int>(B), static_cast<int>(H),
        static_cast<int>(D));
  } else {
    heads_rows_kernel<T, false><<<grid_for(S * B * H * D, kThreads), kThreads, 0, s>>>(
        heads, const_cast<T*>(rows), S, B, H, D);
  }
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void add_position_embedding(T* x, const nd<T>* pe, int64_t S, int64_t B, int64_t h, cudaStream_t s) {
  if (S * B * h == 0) return;
  add_pos_kernel<T><<<row_chunk_grid(S * B, h), kVecThreads, 0, s>>>(x, pe, S, B, h);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void position_embedding_backward(const T* dx, float* dpe, int64_t S, int64_t B, int64_t h, cudaStream_t s) {
  pos_backward_kernel<T><<<grid_for(S * h, kThreads), kThreads, 0, s>>>(dx, dpe, S, B, h);
  MT_CUDA_LAUNCH_CHECK();
}

MT_INSTANTIATE_HALF(qkv_split);
MT_INSTANTIATE_HALF(qkv_split_to_cache);
MT_INSTANTIATE_HALF(qkv_merge);
MT_INSTANTIATE_HALF(heads_to_rows);
MT_INSTANTIATE_HALF(rows_to_heads);
MT_INSTANTIATE_HALF(add_position_embedding);
MT_INSTANTIATE_HALF(position_embedding_backward);

}  // namespace mt::cuda
