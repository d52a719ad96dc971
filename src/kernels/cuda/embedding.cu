// Token embedding. Forward is a row gather. Backward is a scatter-add with repeated ids, made
// deterministic without atomics: positions are sorted by id with a stable radix sort (so each
// id's positions stay in increasing n), and the block that sees the first position of an id
// sums all of that id's rows in order and adds the sum into the table's row.
#include <cub/device/device_radix_sort.cuh>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

template <typename T>
__global__ void gather_kernel(const int32_t* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                              int64_t dim, bool vec) {
  constexpr int N = Vec<T>::N;
  const int64_t i = blockIdx.x;
  const T* src = table + static_cast<int64_t>(ids[i]) * dim;
  T* dst = out + i * dim;
  if (vec) {
    for (int64_t j = threadIdx.x * N; j < dim; j += static_cast<int64_t>(blockDim.x) * N)
      *reinterpret_cast<uint4*>(dst + j) = *reinterpret_cast<const uint4*>(src + j);
  } else {
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = src[j];
  }
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = static_cast<int32_t>(i);
}

// One block per sorted position; only the first position of each id's run does work.
template <typename T>
__global__ void segment_sum_kernel(const int32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                                   const T* __restrict__ dout, float* __restrict__ dtable, int64_t n, int64_t dim) {
  const int64_t i = blockIdx.x;
  const int32_t id = keys[i];
  if (i > 0 && keys[i - 1] == id) return;
  int64_t end = i + 1;
  while (end < n && keys[end] == id) ++end;
  float* dst = dtable + static_cast<int64_t>(id) * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    float acc = 0.f;
    for (int64_t t = i; t < end; ++t) acc += to_f(dout[static_cast<int64_t>(pos[t]) * dim + j]);
    dst[j] += acc;
  }
}

}  // namespace

template <typename T>
void embedding_forward(const int32_t* ids, const T* table, nd<T>* out, int64_t n, int64_t dim, cudaStream_t s) {
  if (n == 0 || dim == 0) return;
  const bool vec = dim % Vec<T>::N == 0 && aligned16(table) && aligned16(out);
  const int threads =
      static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(dim / (vec ? Vec<T>::N : 1), 32) * 32)));
  gather_kernel<<<static_cast<unsigned>(n), threads, 0, s>>>(ids, table, out, dim, vec);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t dim, cudaStream_t s) {
  if (n == 0 || dim == 0) return;
  MT_CHECK(n < (int64_t{1} << 31), "embedding backward over {} tokens exceeds the int32 index range", n);
  const int ni = static_cast<int>(n);
  // Layout of one scratch allocation: positions in, sorted keys, sorted positions, cub temp.
  size_t temp_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), ni, 0, 32, s));
  const size_t arr = (static_cast<size_t>(n) * 4 + 255) / 256 * 256;
  Scratch scratch(3 * arr + temp_bytes, s);
  char* base = scratch.as<char>();
  int32_t* pos_in = reinterpret_cast<int32_t*>(base);
  int32_t* keys_out = reinterpret_cast<int32_t*>(base + arr);
  int32_t* pos_out = reinterpret_cast<int32_t*>(base + 2 * arr);
  void* temp = base + 3 * arr;
  iota_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, s>>>(pos_in, n);
  MT_CUDA_LAUNCH_CHECK();
  // ids are non-negative, so sorting their 32-bit patterns as signed ints is the numeric order.
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys_out, pos_in, pos_out, ni, 0, 32, s));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(dim, 32) * 32)));
  segment_sum_kernel<<<static_cast<unsigned>(n), threads, 0, s>>>(keys_out, pos_out, dout, dtable, n, dim);
  MT_CUDA_LAUNCH_CHECK();
}

MT_INSTANTIATE_STORAGE(embedding_forward);
MT_INSTANTIATE_STORAGE(embedding_backward);

}  // namespace mt::cuda
