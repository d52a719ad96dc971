// RMSNorm and LayerNorm, optionally fused with the residual add that precedes them.
// Forward: one warp per row with the row in registers where it fits (rows of up to 512 16-byte
// vectors); otherwise one block per row, the row read once (16-byte vectors), kept in shared
// memory as fp32, reduced, and written normalised.
// Backward: for RMSNorm rows that fit in registers (up to 256 vectors), a block of warps owns a
// fixed chunk of rows, a warp per row; otherwise (and for LayerNorm) a block owns a fixed chunk,
// warps first compute each row's reduction terms, then threads own columns and walk the rows in
// order. Either way each block
// writes its dw/db partial sums and partial_rows_sum_add (common.cuh) adds them in a fixed order.
// Fixed shapes everywhere: deterministic, no atomics (but the forward's optional FP8 amax, a
// max joined by atomicMax: order-free, so deterministic as well).
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

constexpr int kChunkRows = 16;
constexpr int kBwdThreads = 256;
constexpr int kUnroll = 4;  // forward: vectors in flight per thread
constexpr int kWarpRowsPerBlock = 4;

// Forward for rows of at most 32 * VPL vectors (vector path only): one warp per row, the row in
// registers (VPL 16-byte vectors per lane, all loads in flight at once), warp-shuffle
// reductions, no shared memory or block barriers.
template <typename T, bool LN, bool ADD, int VPL>
__global__ void __launch_bounds__(kWarpRowsPerBlock * 32)
    norm_fwd_warp_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ sum_out,
                         const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                         float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows, int64_t dim,
                         float eps, float* amax) {
  allow_dependent_launch();
  constexpr int N = Vec<T>::N;
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * static_cast<int64_t>(kWarpRowsPerBlock) + (threadIdx.x >> 5);
  if (r >= rows) return;  // the whole warp: commit_amax below needs all its lanes
  const int nvec = static_cast<int>(dim / N);
  float v[VPL][N];
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int vi = k * 32 + lane;
    if (vi < nvec) {
      Vec<T>::load(x + r * dim + vi * N, v[k]);
    } else {
#pragma unroll
      for (int e = 0; e < N; ++e) v[k][e] = 0.f;
    }
  }
  if constexpr (ADD) {
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int vi = k * 32 + lane;
      if (vi >= nvec) continue;
      float q[N];
      Vec<T>::load(res + r * dim + vi * N, q);
      // The stored sum is what later layers see; normalise exactly that (rounded) value.
#pragma unroll
      for (int e = 0; e < N; ++e) v[k][e] = to_f(from_f<T>(v[k][e] + q[e]));
      Vec<T>::store(sum_out + r * dim + vi * N, v[k]);
    }
  }
  float acc = 0.f;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int e = 0; e < N; ++e) acc += LN ? v[k][e] : v[k][e] * v[k][e];
  acc = warp_sum(acc);
  const float inv_dim = 1.f / static_cast<float>(dim);
  float mu = 0.f, rs;
  if constexpr (LN) {
    mu = acc * inv_dim;
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      if (k * 32 + lane >= nvec) continue;  // padding slots are zeros, not x - mu
#pragma unroll
      for (int e = 0; e < N; ++e) ss += (v[k][e] - mu) * (v[k][e] - mu);
    }
    rs = 1.f / sqrtf(warp_sum(ss) * inv_dim + eps);
  } else {
    rs = 1.f / sqrtf(acc * inv_dim + eps);
  }
  if (lane == 0) {
    rstd_out[r] = rs;
    if constexpr (LN) mean_out[r] = mu;
  }
  float m = 0.f;  // max |y| as stored, for amax
#pragma unroll
  for (int k = 0; k < VPL; ++k) {
    const int vi = k * 32 + lane;
    if (vi >= nvec) continue;
    float wv[N], o[N];
    Vec<T>::load(w + vi * N, wv);
#pragma unroll
    for (int e = 0; e < N; ++e) o[e] = (v[k][e] - mu) * rs * wv[e];
    if constexpr (LN) {
      float bv[N];
      Vec<T>::load(b + vi * N, bv);
#pragma unroll
      for (int e = 0; e < N; ++e) o[e] += bv[e];
    }
    Vec<T>::store(y + r * dim + vi * N, o);
    if (amax) m = stored_amax<T, N>(m, o, N);
  }
  if (amax) commit_amax(m, amax);
}

template <typename T, bool LN, bool ADD>
__global__ void norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ sum_out,
                                const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                                float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t dim, float eps,
                                bool vec, float* amax) {
  allow_dependent_launch();
  constexpr int N = Vec<T>::N;
  extern __shared__ float row[];
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  float acc = 0.f;
  // kUnroll vectors per thread per round, all loads issued before any is used.
  for (int64_t base = threadIdx.x * N; base < dim; base += kUnroll * step) {
    float v[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j0 = base + u * step;
      if (j0 < dim) load_group(x + r * dim + j0, dim - j0 < N ? static_cast<int>(dim - j0) : N, vec, v[u]);
    }
    if constexpr (ADD) {
      float q[kUnroll][N];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j0 = base + u * step;
        if (j0 < dim) load_group(res + r * dim + j0, dim - j0 < N ? static_cast<int>(dim - j0) : N, vec, q[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j0 = base + u * step;
        if (j0 >= dim) continue;
          // The stored sum is what later layers see; normalise exactly that (rounded) value.
#pragma unroll
        for (int e = 0; e < N; ++e) v[u][e] = to_f(from_f<T>(v[u][e] + q[u][e]));
        store_group(sum_out + r * dim + j0, dim - j0 < N ? static_cast<int>(dim - j0) : N, vec, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j0 = base + u * step;
      if (j0 >= dim) continue;
      const int cnt = dim - j0 < N ? static_cast<int>(dim - j0) : N;
#pragma unroll
      for (int e = 0; e < N; ++e)
        if (e < cnt) {
          row[j0 + e] = v[u][e];
          acc += LN ? v[u][e] : v[u][e] * v[u][e];
        }
    }
  }
  const float total = block_sum(acc, red);
  float mu = 0.f, rs;
  if constexpr (LN) {
    mu = total / static_cast<float>(dim);
    // Centred second pass over this thread's own elements (no cancellation for large means).
    float ss = 0.f;
    for (int64_t j0 = threadIdx.x * N; j0 < dim; j0 += step)
      for (int e = 0; e < N && j0 + e < dim; ++e) {
        const float d = row[j0 + e] - mu;
        ss += d * d;
      }
    const float var = block_sum(ss, red) / static_cast<float>(dim);
    rs = 1.f / sqrtf(var + eps);
  } else {
    rs = 1.f / sqrtf(total / static_cast<float>(dim) + eps);
  }
  if (threadIdx.x == 0) {
    rstd_out[r] = rs;
    if constexpr (LN) mean_out[r] = mu;
  }
  float m = 0.f;  // max |y| as stored, for amax
  for (int64_t j0 = threadIdx.x * N; j0 < dim; j0 += step) {
    const int cnt = dim - j0 < N ? static_cast<int>(dim - j0) : N;
    float wv[N], bv[N], o[N];
    load_group(w + j0, cnt, vec, wv);
    if constexpr (LN) load_group(b + j0, cnt, vec, bv);
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (e < cnt) {
        o[e] = (row[j0 + e] - mu) * rs * wv[e];
        if constexpr (LN) o[e] += bv[e];
      }
    store_group(y + r * dim + j0, cnt, vec, o);
    if (amax) m = stored_amax<T, N>(m, o, cnt);
  }
  if (amax) commit_amax(m, amax);  // blockDim is a multiple of 32
}

// Phase 1 (warp per row): c[0] = mean(g * xh) for RMS; c[0] = mean(g), c[1] = mean(g * xh) for LN.
// Phase 2 (threads over columns): dx = rs * (g - [c0 LN] - xh * c), dw += dy * xh, db += dy.
template <typename T, bool LN>
__global__ void __launch_bounds__(kBwdThreads)
    norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                    const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dx_add,
                    T* __restrict__ dx, float* __restrict__ part_w, float* __restrict__ part_b, int64_t rows,
                    int64_t dim, bool vec) {
  constexpr int N = Vec<T>::N;
  __shared__ float cst[kChunkRows][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kChunkRows);
  const int nr = rows - r0 < kChunkRows ? static_cast<int>(rows - r0) : kChunkRows;
  const float inv_dim = 1.f / static_cast<float>(dim);
  if (dx) {
    for (int i = warp; i < nr; i += nwarps) {
      const int64_t r = r0 + i;
      const float m = LN ? mean[r] : 0.f, rs = rstd[r];
      float s1 = 0.f, s2 = 0.f;
#pragma unroll 4
      for (int64_t j0 = lane * N; j0 < dim; j0 += 32 * N) {
        const int cnt = dim - j0 < N ? static_cast<int>(dim - j0) : N;
        float d[N], xv[N], wv[N];
        load_group(dy + r * dim + j0, cnt, vec, d);
        load_group(x + r * dim + j0, cnt, vec, xv);
        load_group(w + j0, cnt, vec, wv);
#pragma unroll
        for (int e = 0; e < N; ++e)
          if (e < cnt) {
            const float g = d[e] * wv[e];
            s1 += g;
            s2 += g * ((xv[e] - m) * rs);
          }
      }
      s1 = warp_sum(s1);
      s2 = warp_sum(s2);
      if (lane == 0) {
        cst[i][0] = LN ? s1 * inv_dim : s2 * inv_dim;
        cst[i][1] = s2 * inv_dim;
      }
    }
  }
  __syncthreads();
  for (int64_t j0 = threadIdx.x * N; j0 < dim; j0 += static_cast<int64_t>(blockDim.x) * N) {
    const int cnt = dim - j0 < N ? static_cast<int>(dim - j0) : N;
    float wv[N], aw[N] = {}, ab[N] = {};
    load_group(w + j0, cnt, vec, wv);
#pragma unroll 4
    for (int i = 0; i < nr; ++i) {
      const int64_t r = r0 + i;
      const float m = LN ? mean[r] : 0.f, rs = rstd[r];
      float d[N], xv[N], o[N];
      load_group(dy + r * dim + j0, cnt, vec, d);
      load_group(x + r * dim + j0, cnt, vec, xv);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float xh = (xv[e] - m) * rs;
        aw[e] += d[e] * xh;
        ab[e] += d[e];
        if (LN)
          o[e] = rs * (d[e] * wv[e] - cst[i][0] - xh * cst[i][1]);
        else
          o[e] = rs * (d[e] * wv[e] - xh * cst[i][0]);
      }
      if (dx) {
        if (dx_add) {
          float a[N];
          load_group(dx_add + r * dim + j0, cnt, vec, a);
#pragma unroll
          for (int e = 0; e < N; ++e) o[e] += a[e];
        }
        store_group(dx + r * dim + j0, cnt, vec, o);
      }
    }
#pragma unroll
    for (int e = 0; e < N; ++e) {
      if (e >= cnt) continue;
      if (part_w) part_w[blockIdx.x * dim + j0 + e] = aw[e];
      if (part_b) part_b[blockIdx.x * dim + j0 + e] = ab[e];
    }
  }
}

// Backward for rows of at most 32 * VPL vectors (vector path only): a block of kBwdWarps warps
// owns kBwdRows consecutive rows, a warp per row at a time with the row's dy, x (and dx_add) in
// registers (raw 16-byte vectors) for both passes. Each lane sums dw/db for its own columns over
// its rows in shared memory (lane-private slots, padded so the final column-order read is free of
// bank conflicts), which keeps registers low enough for two blocks per SM; the warps' sums are
// then added in warp order and written as the block's partial row. Fixed assignment and order:
// deterministic.
constexpr int kBwdWarps = 8, kBwdRows = 32;

// Shared-memory slot of (vector k, element e, lane) in one warp's accumulator: stride 33 per
// (k, e) so that both the lane-parallel updates and the column-parallel final read hit 32 banks.
template <int N>
__device__ __forceinline__ int acc_slot(int k, int e, int lane) {
  return (k * N + e) * 33 + lane;
}

template <typename T>
__device__ __forceinline__ void unpack_raw(const uint4& u, float* out) {
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(u.x), out[1] = __uint_as_float(u.y), out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
  } else if constexpr (std::is_same_v<T, __half>) {
    const uint32_t wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&wd[i]));
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  } else {
    const uint32_t wd[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(wd[i] << 16);
      out[2 * i + 1] = __uint_as_float(wd[i] & 0xffff0000u);
    }
  }
}

template <typename T, bool LN, int VPL>
__global__ void __launch_bounds__(kBwdWarps * 32, 2)
    norm_bwd_warp_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ w,
                         const float* __restrict__ mean, const float* __restrict__ rstd, const T* __restrict__ dx_add,
                         T* __restrict__ dx, float* __restrict__ part_w, float* __restrict__ part_b, int64_t rows,
                         int64_t dim) {
  constexpr int N = Vec<T>::N;
  constexpr int kSlots = VPL * N * 33;  // one warp's accumulator
  extern __shared__ float acc[];        // [kBwdWarps][kSlots] for dw, then the same for db (LN)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = static_cast<int>(dim / N);
  const int64_t r0 = blockIdx.x * static_cast<int64_t>(kBwdRows);
  const float inv_dim = 1.f / static_cast<float>(dim);
  float* aw = acc + warp * kSlots;
  float* ab = acc + (kBwdWarps + warp) * kSlots;
#pragma unroll
  for (int k = 0; k < VPL; ++k)
#pragma unroll
    for (int e = 0; e < N; ++e) {
      aw[acc_slot<N>(k, e, lane)] = 0.f;
      if constexpr (LN) ab[acc_slot<N>(k, e, lane)] = 0.f;
    }
  for (int i = warp; i < kBwdRows; i += kBwdWarps) {
    const int64_t r = r0 + i;
    if (r >= rows) break;
    const float m = LN ? mean[r] : 0.f, rs = rstd[r];
    uint4 rd[VPL], rx[VPL], ra[VPL];
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int vi = k * 32 + lane;
      if (vi < nvec) {
        rd[k] = *reinterpret_cast<const uint4*>(dy + r * dim + vi * N);
        rx[k] = *reinterpret_cast<const uint4*>(x + r * dim + vi * N);
        if (dx_add) ra[k] = *reinterpret_cast<const uint4*>(dx_add + r * dim + vi * N);
      }
    }
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int vi = k * 32 + lane;
      if (vi >= nvec) continue;
      float d[N], xv[N], wv[N];
      unpack_raw<T>(rd[k], d);
      unpack_raw<T>(rx[k], xv);
      Vec<T>::load(w + vi * N, wv);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float g = d[e] * wv[e];
        s1 += g;
        s2 += g * ((xv[e] - m) * rs);
      }
    }
    s1 = warp_sum(s1);
    s2 = warp_sum(s2);
    const float c1 = LN ? s1 * inv_dim : 0.f, c2 = s2 * inv_dim;
#pragma unroll
    for (int k = 0; k < VPL; ++k) {
      const int vi = k * 32 + lane;
      if (vi >= nvec) continue;
      float d[N], xv[N], wv[N], o[N];
      unpack_raw<T>(rd[k], d);
      unpack_raw<T>(rx[k], xv);
      Vec<T>::load(w + vi * N, wv);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float xh = (xv[e] - m) * rs;
        o[e] = rs * (d[e] * wv[e] - c1 - xh * c2);
        aw[acc_slot<N>(k, e, lane)] += d[e] * xh;
        if constexpr (LN) ab[acc_slot<N>(k, e, lane)] += d[e];
      }
      if (dx) {
        if (dx_add) {
          float a[N];
          unpack_raw<T>(ra[k], a);
#pragma unroll
          for (int e = 0; e < N; ++e) o[e] += a[e];
        }
        Vec<T>::store(dx + r * dim + vi * N, o);
      }
    }
  }
  __syncthreads();
  // Column j's slot in every warp's accumulator, the warps added in order.
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
    const int vi = static_cast<int>(j / N), slot = acc_slot<N>(vi / 32, static_cast<int>(j % N), vi % 32);
    float sw = 0.f, sb = 0.f;
#pragma unroll
    for (int wi = 0; wi < kBwdWarps; ++wi) {
      sw += acc[wi * kSlots + slot];
      if constexpr (LN) sb += acc[(kBwdWarps + wi) * kSlots + slot];
    }
    if (part_w) part_w[blockIdx.x * dim + j] = sw;
    if (LN && part_b) part_b[blockIdx.x * dim + j] = sb;
  }
}

template <typename T>
bool vec_rows(int64_t dim, std::initializer_list<const void*> ptrs) {
  if (dim % Vec<T>::N) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

template <typename T, bool LN, bool ADD>
void norm_fwd(const T* x, const T* res, T* sum, const T* w, const T* b, T* y, float* mean, float* rstd, int64_t rows,
              int64_t dim, float eps, cudaStream_t s, float* amax = nullptr) {
  if (amax) MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  if (rows == 0 || dim == 0) return;
  const bool vec = vec_rows<T>(dim, {x, res, sum, w, b, y});
  const int64_t nvec = ceil_div(dim, Vec<T>::N);
  if (vec && nvec <= 32 * 16) {  // the common case: one warp per row, the row in registers
    const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kWarpRowsPerBlock));
    auto launch = [&](auto vpl) {
      norm_fwd_warp_kernel<T, LN, ADD, decltype(vpl)::value>
          <<<blocks, kWarpRowsPerBlock * 32, 0, s>>>(x, res, sum, w, b, y, mean, rstd, rows, dim, eps, amax);
    };
    if (nvec <= 32)
      launch(std::integral_constant<int, 1>{});
    else if (nvec <= 64)
      launch(std::integral_constant<int, 2>{});
    else if (nvec <= 128)
      launch(std::integral_constant<int, 4>{});
    else if (nvec <= 256)
      launch(std::integral_constant<int, 8>{});
    else
      launch(std::integral_constant<int, 16>{});
    MT_CUDA_LAUNCH_CHECK();
    return;
  }
  const size_t smem = static_cast<size_t>(dim) * sizeof(float);
  MT_CHECK(smem <= 227 * 1024, "norm dim {} too large for the GPU kernel", dim);
  auto kern = norm_fwd_kernel<T, LN, ADD>;
  if (smem > 48 * 1024)
    MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // About kUnroll vectors per thread: few threads per row, several loads in flight each.
  const int threads =
      static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(ceil_div(nvec, kUnroll), 32) * 32)));
  kern<<<static_cast<unsigned>(rows), threads, smem, s>>>(x, res, sum, w, b, y, mean, rstd, dim, eps, vec, amax);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T, bool LN>
void norm_bwd(const T* dy, const T* x, const T* w, const float* mean, const float* rstd, T* dx, float* dw, float* db,
              int64_t rows, int64_t dim, const T* dx_add, cudaStream_t s) {
  if (rows == 0 || dim == 0) return;
  const bool vec = vec_rows<T>(dim, {dy, x, w, dx, dx_add});
  const int64_t nvec = ceil_div(dim, Vec<T>::N);
  // LayerNorm keeps the column kernel: its warp version carries dw and db sums per lane (~230
  // registers, one block per SM) and measured slower on an H100 (370 vs 507 GB/s at 8192x2048).
  const bool warp_path = !LN && vec && nvec <= 32 * 8;
  const int64_t chunks = ceil_div(rows, warp_path ? kBwdRows : kChunkRows);
  Scratch pw(dw ? static_cast<size_t>(chunks * dim) * 4 : 0, s);
  Scratch pb(db ? static_cast<size_t>(chunks * dim) * 4 : 0, s);
  if (warp_path) {  // the common case: a warp per row, the row in registers
    auto launch = [&](auto vpl) {
      constexpr int V = decltype(vpl)::value;
      auto kern = norm_bwd_warp_kernel<T, LN, V>;
      const size_t smem = static_cast<size_t>(kBwdWarps) * V * Vec<T>::N * 33 * sizeof(float) * (LN ? 2 : 1);
      if (smem > 48 * 1024)
        MT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
      kern<<<static_cast<unsigned>(chunks), kBwdWarps * 32, smem, s>>>(dy, x, w, mean, rstd, dx_add, dx, pw.as<float>(),
                                                                        pb.as<float>(), rows, dim);
    };
    if (nvec <= 32)
      launch(std::integral_constant<int, 1>{});
    else if (nvec <= 64)
      launch(std::integral_constant<int, 2>{});
    else if (nvec <= 128)
      launch(std::integral_constant<int, 4>{});
    else
      launch(std::integral_constant<int, 8>{});
  } else {
    norm_bwd_kernel<T, LN><<<static_cast<unsigned>(chunks), kBwdThreads, 0, s>>>(
        dy, x, w, mean, rstd, dx_add, dx, pw.as<float>(), pb.as<float>(), rows, dim, vec);
  }
  MT_CUDA_LAUNCH_CHECK();
  if (dw) partial_rows_sum_add(pw.as<float>(), dw, chunks, dim, s);
  if (db) partial_rows_sum_add(pb.as<float>(), db, chunks, dim, s);
}

}  // namespace

template <typename T>
void rmsnorm_forward(const T* x, const nd<T>* w, nd<T>* y, float* rstd, int64_t rows, int64_t dim, float eps,
                     cudaStream_t s, float* amax) {
  norm_fwd<T, false, false>(x, nullptr, nullptr, w, nullptr, y, nullptr, rstd, rows, dim, eps, s, amax);
}
template <typename T>
void add_rmsnorm_forward(const T* x, const nd<T>* res, nd<T>* sum, const nd<T>* w, nd<T>* y, float* rstd, int64_t rows,
                         int64_t dim, float eps, cudaStream_t s, float* amax) {
  norm_fwd<T, false, true>(x, res, sum, w, nullptr, y, nullptr, rstd, rows, dim, eps, s, amax);
}
template <typename T>
void rmsnorm_backward(const T* dy, const nd<T>* x, const nd<T>* w, const float* rstd, nd<T>* dx, float* dw,
                      int64_t rows, int64_t dim, cudaStream_t s, const nd<T>* dx_add) {
  norm_bwd<T, false>(dy, x, w, nullptr, rstd, dx, dw, nullptr, rows, dim, dx_add, s);
}
template <typename T>
void layernorm_forward(const T* x, const nd<T>* w, const nd<T>* b, nd<T>* y, float* mean, float* rstd, int64_t rows,
                       int64_t dim, float eps, cudaStream_t s) {
  norm_fwd<T, true, false>(x, nullptr, nullptr, w, b, y, mean, rstd, rows, dim, eps, s);
}
template <typename T>
void add_layernorm_forward(const T* x, const nd<T>* res, nd<T>* sum, const nd<T>* w, const nd<T>* b, nd<T>* y,
                           float* mean, float* rstd, int64_t rows, int64_t dim, float eps, cudaStream_t s) {
  norm_fwd<T, true, true>(x, res, sum, w, b, y, mean, rstd, rows, dim, eps, s);
}
template <typename T>
void layernorm_backward(const T* dy, const nd<T>* x, const nd<T>* w, const float* mean, const float* rstd, nd<T>* dx,
                        float* dw, float* db, int64_t rows, int64_t dim, cudaStream_t s, const nd<T>* dx_add) {
  norm_bwd<T, true>(dy, x, w, mean, rstd, dx, dw, db, rows, dim, dx_add, s);
}

MT_INSTANTIATE_STORAGE(rmsnorm_forward);
MT_INSTANTIATE_STORAGE(add_rmsnorm_forward);
MT_INSTANTIATE_STORAGE(rmsnorm_backward);
MT_INSTANTIATE_STORAGE(layernorm_forward);
MT_INSTANTIATE_STORAGE(add_layernorm_forward);
MT_INSTANTIATE_STORAGE(layernorm_backward);

}  // namespace mt::cuda
