// Vocab-parallel embedding and cross-entropy on the GPU (the vocab_* ops of ops.def, and the
// steps of vocab_parallel.h). A rank holds vocabulary entries [start, start + vl): ids and labels
// outside that range contribute nothing here and are completed by the collectives the caller's
// ShardReduce runs between the steps. One block per row throughout; every reduction has a fixed
// shape and order.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/cuda/vocab_parallel.h"
#include "kernels/op_backends.h"

namespace mt::cuda {

namespace {

constexpr int kRowThreads = 512;

__device__ __forceinline__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nw ? sh[lane] : -INFINITY;
    t = warp_max(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  return sh[0];
}

// Loads up to N consecutive row elements starting at j0 (of `len`): a vector when allowed and
// full; missing elements read as `fill`. Returns how many were real.
template <typename T>
__device__ __forceinline__ int load_row_group(const T* row, int64_t j0, int64_t len, bool vec, float fill,
                                              float* v) {
  constexpr int N = Vec<T>::N;
  const int cnt = len - j0 < N ? static_cast<int>(len - j0) : N;
  if (vec && cnt == N) {
    Vec<T>::load(row + j0, v);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] = e < cnt ? to_f(row[j0 + e]) : fill;
  }
  return cnt;
}

// ---- embedding

template <typename T>
__global__ void range_gather_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                                    int64_t start, int64_t vl, int64_t dim, bool vec) {
  constexpr int N = Vec<T>::N;
  const int64_t i = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[i]) - start;
  const bool mine = id >= 0 && id < vl;
  const T* src = table + (mine ? id : 0) * dim;
  T* dst = out + i * dim;
  if (vec) {
    for (int64_t j = threadIdx.x * N; j < dim; j += static_cast<int64_t>(blockDim.x) * N)
      *reinterpret_cast<uint4*>(dst + j) = mine ? *reinterpret_cast<const uint4*>(src + j) : make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = mine ? src[j] : from_f<T>(0.f);
  }
}

// Sort keys: the local row of an id in range, or vl (sorted last, skipped) for the others.
__global__ void range_keys_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ keys, int32_t* __restrict__ pos,
                                  int64_t n, int64_t start, int64_t vl) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t id = static_cast<int64_t>(ids[i]) - start;
  keys[i] = static_cast<int32_t>(id >= 0 && id < vl ? id : vl);
  pos[i] = static_cast<int32_t>(i);
}

// One block per sorted position; the first position of each key's run sums that key's rows in
// increasing position order (the radix sort is stable) and adds the sum to the table row.
template <typename T>
__global__ void range_segment_sum_kernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                                         const T* __restrict__ dout, float* __restrict__ dtable, int64_t n,
                                         int64_t vl, int64_t dim) {
  const int64_t i = blockIdx.x;
  const int32_t key = keys[i];
  if (key == vl || (i > 0 && keys[i - 1] == key)) return;
  int64_t end = i + 1;
  while (end < n && keys[end] == key) ++end;
  float* dst = dtable + static_cast<int64_t>(key) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t t = i; t < end; ++t) acc += to_f(dout[static_cast<int64_t>(pos[t]) * dim + j]);
    dst[j] += acc;
  }
}

int row_threads(int64_t work) {
  return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(work, 32) * 32)));
}

template <typename T>
void range_gather(const int32_t* ids, const T* table, T* out, int64_t n, int64_t start, int64_t vl, int64_t dim,
                  cudaStream_t s) {
  if (n == 0 || dim == 0) return;
  const bool vec = dim % Vec<T>::N == 0 && aligned16(table) && aligned16(out);
  range_gather_kernel<<<static_cast<unsigned>(n), row_threads(vec ? dim / Vec<T>::N : dim), 0, s>>>(
      ids, table, out, start, vl, dim, vec);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void range_scatter_add(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t start, int64_t vl,
                       int64_t dim, cudaStream_t s) {
  if (n == 0 || dim == 0 || vl == 0) return;
  MT_CHECK(n < (int64_t{1} << 31) && vl < (int64_t{1} << 31) - 1,
           "vocab-parallel embedding backward: {} tokens or {} rows exceed the int32 index range", n, vl);
  const int ni = static_cast<int>(n);
  int end_bit = 1;  // keys lie in [0, vl]: sort only the bits that can be set
  while (end_bit < 32 && (int64_t{1} << end_bit) <= vl) ++end_bit;
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), ni, 0, end_bit, s));
  // One scratch allocation: keys and positions in, keys and positions sorted, cub's temp.
  const size_t arr = (static_cast<size_t>(n) * 4 + 255) / 256 * 256;
  Scratch scratch(4 * arr + temp_bytes, s);
  char* base = scratch.as<char>();
  int32_t* keys_in = reinterpret_cast<int32_t*>(base);
  int32_t* pos_in = reinterpret_cast<int32_t*>(base + arr);
  int32_t* keys_out = reinterpret_cast<int32_t*>(base + 2 * arr);
  int32_t* pos_out = reinterpret_cast<int32_t*>(base + 3 * arr);
  void* temp = base + 4 * arr;
  range_keys_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, s>>>(ids, keys_in, pos_in, n, start, vl);
  MT_CUDA_LAUNCH_CHECK();
  MT_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, pos_in, pos_out, ni, 0, end_bit, s));
  range_segment_sum_kernel<<<static_cast<unsigned>(n), row_threads(dim), 0, s>>>(keys_out, pos_out, dout, dtable, n,
                                                                                 vl, dim);
  MT_CUDA_LAUNCH_CHECK();
}

// ---- cross-entropy

template <typename T>
__global__ void row_max_kernel(const T* __restrict__ logits, float* __restrict__ out, int64_t vl, bool vec) {
  constexpr int N = Vec<T>::N;
  __shared__ float sh[32];
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * vl;
  float m = -INFINITY;
  for (int64_t j0 = threadIdx.x * N; j0 < vl; j0 += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    load_row_group(row, j0, vl, vec, -INFINITY, v);
#pragma unroll
    for (int e = 0; e < N; ++e) m = fmaxf(m, v[e]);
  }
  m = block_max(m, sh);
  if (threadIdx.x == 0) out[blockIdx.x] = m;
}

template <typename T>
__global__ void partial_stats_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                                     const float* __restrict__ row_max, float* __restrict__ stats, int64_t vl,
                                     int64_t start, bool vec) {
  constexpr int N = Vec<T>::N;
  __shared__ float sh[32];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * vl;
  const float m = row_max[r];
  float s = 0.f;
  for (int64_t j0 = threadIdx.x * N; j0 < vl; j0 += static_cast<int64_t>(blockDim.x) * N) {
    float v[N];
    const int cnt = load_row_group(row, j0, vl, vec, 0.f, v);
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (e < cnt) s += __expf(v[e] - m);
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(labels[r]) - start;
    stats[2 * r] = s;
    stats[2 * r + 1] = t >= 0 && t < vl ? to_f(row[t]) : 0.f;
  }
}

__global__ void finish_kernel(const float* __restrict__ row_max, const float* __restrict__ stats,
                              float* __restrict__ losses, float* __restrict__ lse, int64_t n) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  const float l = row_max[r] + logf(stats[2 * r]);
  lse[r] = l;
  losses[r] = l - stats[2 * r + 1];
}

// No __restrict__ on logits/dlogits: they are the same buffer.
template <typename T>
__global__ void ce_range_bwd_kernel(const T* logits, const int32_t* __restrict__ labels, const float* __restrict__ lse,
                                    const float* __restrict__ dloss, T* dlogits, int64_t vl, int64_t start, bool vec) {
  constexpr int N = Vec<T>::N;
  const int64_t r = blockIdx.x;
  const float g = dloss[r], l = lse[r];
  const int64_t t = static_cast<int64_t>(labels[r]) - start;  // outside [0, vl): no column matches
  const T* row = logits + r * vl;
  T* drow = dlogits + r * vl;
  for (int64_t j0 = threadIdx.x * N; j0 < vl; j0 += static_cast<int64_t>(blockDim.x) * N) {
    float v[N], o[N];
    const int cnt = load_row_group(row, j0, vl, vec, 0.f, v);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      o[e] = g * __expf(v[e] - l);
      if (j0 + e == t) o[e] -= g;
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

}  // namespace

}  // namespace mt::cuda

namespace mt::ops::gpu {
namespace {

using cuda::compute_stream;

const int32_t* i32(const Tensor& t, int64_t n, const char* what) {
  check_cuda_tensor(t, DType::I32, what);
  MT_CHECK(t.numel() == n, "{}: {} ids/labels for {} rows", what, t.numel(), n);
  return t.data<int32_t>();
}
const float* f32(const Tensor& t, int64_t n, const char* what) {
  check_cuda_tensor(t, DType::F32, what);
  MT_CHECK(t.numel() == n, "{}: {} values for {} rows", what, t.numel(), n);
  return t.data<float>();
}

template <typename T>
bool rows_vectorisable(const T* p, int64_t row_len) {
  return row_len % cuda::Vec<T>::N == 0 && cuda::aligned16(p);
}

}  // namespace

Tensor vocab_embedding_forward(const Tensor& ids, const Tensor& table, int64_t start) {
  check_float_tensor(table, "vocab_embedding_forward");
  MT_CHECK(table.ndim() == 2, "vocab_embedding_forward: table {} is not [rows, h]", table.shape_str());
  const int64_t n = ids.numel(), vl = table.dim(0), h = table.dim(1);
  const int32_t* id = i32(ids, n, "vocab_embedding_forward");
  Tensor out = Tensor::empty({n, h}, table.dtype(), Device::CUDA);
  with_float_type(table, [&](auto* t) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(t)>>;
    cuda::range_gather(id, static_cast<const T*>(t), out.data<T>(), n, start, vl, h, compute_stream());
  });
  return out;
}

void vocab_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t start) {
  check_float_tensor(dout, "vocab_embedding_backward");
  check_cuda_tensor(dtable, DType::F32, "vocab_embedding_backward (table gradient)");
  const int64_t n = ids.numel(), vl = dtable.dim(0), h = dtable.dim(1);
  MT_CHECK(dout.numel() == n * h, "vocab_embedding_backward: dout {} for {} ids of width {}", dout.shape_str(), n, h);
  const int32_t* id = i32(ids, n, "vocab_embedding_backward");
  with_float_type(dout, [&](auto* d) {
    cuda::range_scatter_add(id, d, dtable.data<float>(), n, start, vl, h, compute_stream());
  });
}

Tensor vocab_ce_row_max(const Tensor& logits) {
  check_float_tensor(logits, "vocab_ce_row_max");
  const int64_t n = logits.dim(0), vl = logits.dim(1);
  Tensor mx = Tensor::empty({n}, DType::F32, Device::CUDA);
  if (n == 0) return mx;
  MT_CHECK(vl > 0, "vocab_ce_row_max: logits {} have no columns", logits.shape_str());
  with_float_type(logits, [&](auto* x) {
    cuda::row_max_kernel<<<static_cast<unsigned>(n), cuda::kRowThreads, 0, compute_stream()>>>(
        x, mx.data<float>(), vl, rows_vectorisable(x, vl));
    MT_CUDA_LAUNCH_CHECK();
  });
  return mx;
}

Tensor vocab_ce_partial_stats(const Tensor& logits, const Tensor& labels, const Tensor& row_max, int64_t start) {
  check_float_tensor(logits, "vocab_ce_partial_stats");
  const int64_t n = logits.dim(0), vl = logits.dim(1);
  const int32_t* lab = i32(labels, n, "vocab_ce_partial_stats");
  const float* mx = f32(row_max, n, "vocab_ce_partial_stats (row max)");
  Tensor stats = Tensor::empty({n, 2}, DType::F32, Device::CUDA);
  if (n == 0) return stats;
  with_float_type(logits, [&](auto* x) {
    cuda::partial_stats_kernel<<<static_cast<unsigned>(n), cuda::kRowThreads, 0, compute_stream()>>>(
        x, lab, mx, stats.data<float>(), vl, start, rows_vectorisable(x, vl));
    MT_CUDA_LAUNCH_CHECK();
  });
  return stats;
}

void vocab_ce_finish(const Tensor& row_max, const Tensor& stats, Tensor& losses, Tensor& lse) {
  const int64_t n = row_max.numel();
  const float* mx = f32(row_max, n, "vocab_ce_finish (row max)");
  const float* st = f32(stats, 2 * n, "vocab_ce_finish (stats)");
  losses = Tensor::empty({n}, DType::F32, Device::CUDA);
  lse = Tensor::empty({n}, DType::F32, Device::CUDA);
  if (n == 0) return;
  cuda::finish_kernel<<<static_cast<unsigned>(cuda::ceil_div(n, 256)), 256, 0, compute_stream()>>>(
      mx, st, losses.data<float>(), lse.data<float>(), n);
  MT_CUDA_LAUNCH_CHECK();
}

// The three steps around the two all-reduces, with the statistics in fp32 device buffers that the
// reduce combines in place (in stream order with the kernels around it).
void vocab_cross_entropy_forward(const Tensor& logits, const Tensor& labels, int64_t start, const ShardReduce& reduce,
                                 Tensor& losses, Tensor& lse) {
  const int64_t n = logits.dim(0);
  Tensor mx = vocab_ce_row_max(logits);
  if (reduce) reduce(mx.raw(), static_cast<size_t>(n), ReduceType::F32, ReduceOp::Max);
  Tensor stats = vocab_ce_partial_stats(logits, labels, mx, start);
  if (reduce) reduce(stats.raw(), static_cast<size_t>(2 * n), ReduceType::F32, ReduceOp::Sum);
  vocab_ce_finish(mx, stats, losses, lse);
}

Tensor vocab_cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse, const Tensor& dloss,
                                    int64_t start) {
  check_float_tensor(logits, "vocab_cross_entropy_backward");
  const int64_t n = logits.dim(0), vl = logits.dim(1);
  const int32_t* lab = i32(labels, n, "vocab_cross_entropy_backward");
  const float* l = f32(lse, n, "vocab_cross_entropy_backward (lse)");
  const float* g = f32(dloss, n, "vocab_cross_entropy_backward (dloss)");
  if (n == 0) return logits;
  with_float_type(logits, [&](auto* x) {
    cuda::ce_range_bwd_kernel<<<static_cast<unsigned>(n), cuda::kRowThreads, 0, compute_stream()>>>(
        x, lab, l, g, x, vl, start, rows_vectorisable(x, vl));
    MT_CUDA_LAUNCH_CHECK();
  });
  return logits;
}

}  // namespace mt::ops::gpu
