// Elementwise ops: SwiGLU, GELU, dropout, RoPE, add/scale, casts, and the device Philox stream.
// Memory-bound: each thread moves 16-byte vectors where the pointers and sizes allow, with a
// scalar path for tails and odd shapes. Math in fp32; results do not depend on the launch shape.
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"

namespace mt::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t gtid() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t gstride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Runs f(i0, count) over groups of G consecutive elements (the last group may be short).
template <int G, typename F>
__device__ __forceinline__ void for_groups(int64_t n, F f) {
  for (int64_t g = gtid(); g * G < n; g += gstride()) {
    const int64_t i0 = g * G;
    f(i0, n - i0 < G ? static_cast<int>(n - i0) : G);
  }
}


// ---- SwiGLU: grid y walks rows, grid x the 16-byte groups of a row (F % N == 0 for the
// vector path), so there is no per-element division. With `amax` (an FP8 linear's input under
// current scaling, zeroed before): max |output| as stored (after the rounding to T) joins it, in
// the same pass, so that the linear casts without a pass of its own to find the amax.
template <typename T>
__global__ void swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t F, bool vec,
                                  float* amax) {
  allow_dependent_launch();
  constexpr int N = Vec<T>::N;
  float m = 0.f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t j = gtid() * N; j < F; j += gstride() * N) {
      const int cnt = F - j < N ? static_cast<int>(F - j) : N;
      float gt[N], up[N], out[N];
      load_group(x + r * 2 * F + j, cnt, vec, gt);
      load_group(x + r * 2 * F + F + j, cnt, vec, up);
#pragma unroll
      for (int e = 0; e < N; ++e) out[e] = swiglu_value(gt[e], up[e]);
      store_group(y + r * F + j, cnt, vec, out);
      if (amax) m = stored_amax<T, N>(m, out, cnt);
    }
  if (amax) commit_amax(m, amax);
}
template <typename T>
__global__ void swiglu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t rows,
                                  int64_t F, bool vec, float* amax) {
  constexpr int N = Vec<T>::N;
  float m = 0.f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t j = gtid() * N; j < F; j += gstride() * N) {
      const int cnt = F - j < N ? static_cast<int>(F - j) : N;
      float gt[N], up[N], d[N], dg[N], du[N];
      load_group(x + r * 2 * F + j, cnt, vec, gt);
      load_group(x + r * 2 * F + F + j, cnt, vec, up);
      load_group(dy + r * F + j, cnt, vec, d);
#pragma unroll
      for (int e = 0; e < N; ++e) swiglu_grads(d[e], gt[e], up[e], dg[e], du[e]);
      store_group(dx + r * 2 * F + j, cnt, vec, dg);
      store_group(dx + r * 2 * F + F + j, cnt, vec, du);
      if (amax) m = stored_amax<T, N>(stored_amax<T, N>(m, dg, cnt), du, cnt);
    }
  if (amax) commit_amax(m, amax);
}

// ---- GELU
constexpr float kInvSqrt2 = 0.70710678118654752440f, kInvSqrt2Pi = 0.39894228040143267794f;
constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCubic = 0.044715f;

template <typename T>
__global__ void gelu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, bool tanh_approx, bool vec) {
  constexpr int N = Vec<T>::N;
  for_groups<N>(n, [&](int64_t i0, int cnt) {
    float v[N], o[N];
    load_group(x + i0, cnt, vec, v);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float a = v[e];
      o[e] = tanh_approx ? 0.5f * a * (1.f + tanhf(kSqrt2OverPi * (a + kCubic * a * a * a)))
                         : 0.5f * a * (1.f + erff(a * kInvSqrt2));
    }
    store_group(y + i0, cnt, vec, o);
  });
}
template <typename T>
__global__ void gelu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t n,
                                bool tanh_approx, bool vec) {
  constexpr int N = Vec<T>::N;
  for_groups<N>(n, [&](int64_t i0, int cnt) {
    float v[N], d[N], o[N];
    load_group(x + i0, cnt, vec, v);
    load_group(dy + i0, cnt, vec, d);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const float a = v[e];
      if (tanh_approx) {
        const float t = tanhf(kSqrt2OverPi * (a + kCubic * a * a * a));
        const float dinner = kSqrt2OverPi * (1.f + 3.f * kCubic * a * a);
        o[e] = d[e] * (0.5f * (1.f + t) + 0.5f * a * (1.f - t * t) * dinner);
      } else {
        const float cdf = 0.5f * (1.f + erff(a * kInvSqrt2));
        const float pdf = kInvSqrt2Pi * expf(-0.5f * a * a);
        o[e] = d[e] * (cdf + a * pdf);
      }
    }
    store_group(dx + i0, cnt, vec, o);
  });
}

// ---- Dropout: element i uses lane i % 4 of Philox block i / 4, exactly as the CPU. A thread
// takes one 16-byte vector of elements (a whole number of Philox blocks).
template <typename T>
__global__ void dropout_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, float p, float scale,
                               uint64_t seed, uint64_t offset, bool vec) {
  constexpr int G = Vec<T>::N;
  static_assert(G % 4 == 0, "a group is whole Philox blocks");
  for_groups<G>(n, [&](int64_t i0, int cnt) {
    float v[G], u[G];
    load_group<T>(x + i0, cnt, vec, v);
#pragma unroll
    for (int k = 0; k < G; k += 4) {
      if (k >= cnt) break;
      const Philox4 b = philox_block(seed, offset, static_cast<uint64_t>(i0 + k) >> 2);
      u[k] = philox_to_unit(b.x), u[k + 1] = philox_to_unit(b.y), u[k + 2] = philox_to_unit(b.z);
      u[k + 3] = philox_to_unit(b.w);
    }
#pragma unroll
    for (int e = 0; e < G; ++e) v[e] = e < cnt && u[e] >= p ? v[e] * scale : 0.f;
    store_group<T>(y + i0, cnt, vec, v);
  });
}

__global__ void philox_uniform_kernel(float* out, int64_t n, uint64_t seed, uint64_t offset, uint64_t first) {
  for (int64_t i = gtid(); i < n; i += gstride())
    out[i] = philox_uniform(seed, offset, first + static_cast<uint64_t>(i));
}

// ---- RoPE (rotate-half) on [B*H*S rows, D]: element i < half pairs with i + half, elements
// from rot_dim = 2 * half on are untouched, and row (bh, s) uses the tables' row s. A 2-D block:
// threadIdx.x walks groups of G pairs of a row, threadIdx.y (with blockIdx.x) picks s, and
// blockIdx.y strides over the B*H heads, so there is no index division and a thread loads its
// cos/sin values once for all the heads it visits. VEC: G = Vec<T>::N pairs as 16-byte accesses
// (half % G == 0, rows and tables 16-byte aligned); otherwise one pair per thread. The per-pair
// fp32 math is the same either way.
template <typename T, bool VEC>
__global__ void rope_kernel(T* __restrict__ x, const float* __restrict__ cs, const float* __restrict__ sn, int64_t BH,
                            int64_t S, int64_t D, int64_t half, float sign) {
  constexpr int G = VEC ? Vec<T>::N : 1;
  const int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y;
  if (s >= S) return;
  const int64_t groups = half / G;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    const int64_t i = g * G;
    float c[G], si[G];
    if constexpr (VEC) {
#pragma unroll
      for (int k = 0; k < G; k += Vec<float>::N) {
        Vec<float>::load(cs + s * half + i + k, c + k);
        Vec<float>::load(sn + s * half + i + k, si + k);
      }
    } else {
      c[0] = cs[s * half + i], si[0] = sn[s * half + i];
    }
#pragma unroll
    for (int e = 0; e < G; ++e) si[e] = __fmul_rn(sign, si[e]);
    for (int64_t bh = blockIdx.y; bh < BH; bh += gridDim.y) {
      T* r = x + (bh * S + s) * D + i;
      float x1[G], x2[G], o1[G], o2[G];
      if constexpr (VEC) {
        Vec<T>::load(r, x1);
        Vec<T>::load(r + half, x2);
      } else {
        x1[0] = to_f(r[0]), x2[0] = to_f(r[half]);
      }
#pragma unroll
      for (int e = 0; e < G; ++e) rope_pair(x1[e], x2[e], c[e], si[e], o1[e], o2[e]);
      if constexpr (VEC) {
        Vec<T>::store(r, o1);
        Vec<T>::store(r + half, o2);
      } else {
        r[0] = from_f<T>(o1[0]);
        r[half] = from_f<T>(o2[0]);
      }
    }
  }
}
__global__ void rope_tables_kernel(int64_t seq, int64_t rot_dim, double base, float* cs, float* sn) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = gtid(); t < seq * half; t += gstride()) {
    const int64_t s = t / half, i = t % half;
    const double inv_freq = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    const double a = static_cast<double>(s) * inv_freq;
    cs[t] = static_cast<float>(cos(a));
    sn[t] = static_cast<float>(sin(a));
  }
}

// ---- add / scale / cast
// A group is G elements of both types: one 16-byte vector of the narrower type, one or two
// of the wider (fp32 += bf16 moves 8 elements as two float4 and one uint4).
template <typename TY, typename TX>
__global__ void add_kernel(TY* __restrict__ y, const TX* __restrict__ x, int64_t n, bool vec) {
  constexpr int G = Vec<TY>::N > Vec<TX>::N ? Vec<TY>::N : Vec<TX>::N;
  for_groups<G>(n, [&](int64_t i0, int cnt) {
    float a[G], b[G];
    load_group<TY, G>(y + i0, cnt, vec, a);
    load_group<TX, G>(x + i0, cnt, vec, b);
#pragma unroll
    for (int e = 0; e < G; ++e) a[e] += b[e];
    store_group<TY, G>(y + i0, cnt, vec, a);
  });
}
template <typename T>
__global__ void scale_kernel(T* __restrict__ y, float a, int64_t n, bool vec) {
  constexpr int N = Vec<T>::N;
  for_groups<N>(n, [&](int64_t i0, int cnt) {
    float v[N];
    load_group(y + i0, cnt, vec, v);
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] *= a;
    store_group(y + i0, cnt, vec, v);
  });
}
// Groups of 8: one bf16 16-byte vector and two fp32 ones.
template <typename TI, typename TO>
__global__ void cast_kernel(const TI* __restrict__ x, TO* __restrict__ y, int64_t n, bool vec) {
  constexpr int G = Vec<TI>::N > Vec<TO>::N ? Vec<TI>::N : Vec<TO>::N;
  for_groups<G>(n, [&](int64_t i0, int cnt) {
    float v[G];
    load_group<TI, G>(x + i0, cnt, vec, v);
    store_group<TO, G>(y + i0, cnt, vec, v);
  });
}

template <typename T>
bool vec_ok(std::initializer_list<const void*> ptrs, int64_t stride_elems) {
  if (stride_elems % Vec<T>::N) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// With an FP8 amax to find, at most 512 rows of blocks (the blocks walk the rest): each warp
// joins its max with one same-address atomic, and a block per row (8192 x 4 blocks for
// llama-1.5b's SwiGLU) would queue a quarter million of them at one L2 slice.
template <typename T>
dim3 row_grid(int64_t rows, int64_t F, bool amax = false) {
  return dim3(grid_for(ceil_div(F, Vec<T>::N), kThreads, 1024),
              static_cast<unsigned>(std::min<int64_t>(rows, amax ? 512 : 65535)));
}
template <typename T>
void rope(T* x, const float* cs, const float* sn, int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot_dim,
          float sign, cudaStream_t s) {
  MT_CHECK(rot_dim % 2 == 0 && rot_dim <= D && rot_dim >= 0, "rotary dim {} must be even and <= head dim {}", rot_dim,
           D);
  const int64_t BH = B * H, half = rot_dim / 2;
  if (BH * S * half == 0) return;
  // Vector path: whole 16-byte groups of pairs, rows (D) and both halves (half) starting on
  // 16-byte boundaries, table rows too (half % 4 == 0 follows from half % Vec<T>::N == 0).
  const bool vec = half % Vec<T>::N == 0 && D % Vec<T>::N == 0 && aligned16(x) && aligned16(cs) && aligned16(sn);
  const int64_t groups = vec ? half / Vec<T>::N : half;
  // Threads over a row's groups (a power of two up to kThreads), the rest of the block over s;
  // grid y over the heads, sized for about 2048 blocks in all (each thread then visits
  // BH / grid.y heads with the same cos/sin values).
  int tx = 1;
  while (tx < groups && tx < kThreads) tx *= 2;
  const dim3 block(tx, kThreads / tx);
  const int64_t gx = ceil_div(S, block.y);
  MT_CHECK(gx < (int64_t{1} << 31), "rope: sequence length {} too long", S);
  const dim3 grid(static_cast<unsigned>(gx),
                  static_cast<unsigned>(std::min<int64_t>({BH, std::max<int64_t>(1, ceil_div(2048, gx)), 65535})));
  if (vec)
    rope_kernel<T, true><<<grid, block, 0, s>>>(x, cs, sn, BH, S, D, half, sign);
  else
    rope_kernel<T, false><<<grid, block, 0, s>>>(x, cs, sn, BH, S, D, half, sign);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename T>
void swiglu_forward(const T* x, nd<T>* y, int64_t rows, int64_t F, cudaStream_t s, float* amax) {
  if (amax) MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  if (rows * F == 0) return;
  const bool vec = vec_ok<T>({x, y}, F);
  swiglu_fwd_kernel<<<row_grid<T>(rows, F, amax != nullptr), kThreads, 0, s>>>(x, y, rows, F, vec, amax);
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void swiglu_backward(const T* dy, const nd<T>* x, nd<T>* dx, int64_t rows, int64_t F, cudaStream_t s, float* amax) {
  if (amax) MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), s));
  if (rows * F == 0) return;
  const bool vec = vec_ok<T>({dy, x, dx}, F);
  swiglu_bwd_kernel<<<row_grid<T>(rows, F, amax != nullptr), kThreads, 0, s>>>(dy, x, dx, rows, F, vec, amax);
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void gelu_forward(const T* x, nd<T>* y, int64_t n, bool t, cudaStream_t s) {
  if (!n) return;
  gelu_fwd_kernel<<<grid_for(ceil_div(n, Vec<T>::N), kThreads), kThreads, 0, s>>>(x, y, n, t, vec_ok<T>({x, y}, 0));
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void gelu_backward(const T* dy, const nd<T>* x, nd<T>* dx, int64_t n, bool t, cudaStream_t s) {
  if (!n) return;
  gelu_bwd_kernel<<<grid_for(ceil_div(n, Vec<T>::N), kThreads), kThreads, 0, s>>>(dy, x, dx, n, t,
                                                                                  vec_ok<T>({dy, x, dx}, 0));
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void dropout_forward(const T* x, nd<T>* y, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t s) {
  if (!n) return;
  if (p <= 0.f) {
    if (x != y) MT_CUDA_CHECK(cudaMemcpyAsync(y, x, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToDevice, s));
    return;
  }
  if (p >= 1.f) {
    MT_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(n) * sizeof(T), s));
    return;
  }
  const float scale = 1.f / (1.f - p);
  dropout_kernel<<<grid_for(ceil_div(n, Vec<T>::N), kThreads), kThreads, 0, s>>>(x, y, n, p, scale, seed, offset,
                                                                                  aligned16(x) && aligned16(y));
  MT_CUDA_LAUNCH_CHECK();
}
// The same mask as the forward's (the same Philox stream), applied to the gradient.
template <typename T>
void dropout_backward(const T* dy, nd<T>* dx, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t s) {
  dropout_forward(dy, dx, n, p, seed, offset, s);
}
template <typename T>
void rope_forward(T* x, const float* cs, const float* sn, int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot_dim,
                  cudaStream_t s) {
  rope(x, cs, sn, B, H, S, D, rot_dim, 1.f, s);
}
template <typename T>
void rope_backward(T* x, const float* cs, const float* sn, int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot_dim,
                   cudaStream_t s) {
  rope(x, cs, sn, B, H, S, D, rot_dim, -1.f, s);
}
template <typename TY, typename TX>
void add_inplace(TY* y, const TX* x, int64_t n, cudaStream_t s) {
  if (!n) return;
  constexpr int G = Vec<TY>::N > Vec<TX>::N ? Vec<TY>::N : Vec<TX>::N;
  add_kernel<<<grid_for(ceil_div(n, G), kThreads), kThreads, 0, s>>>(y, x, n, aligned16(y) && aligned16(x));
  MT_CUDA_LAUNCH_CHECK();
}
template <typename T>
void scale_inplace(T* y, float a, int64_t n, cudaStream_t s) {
  if (!n) return;
  scale_kernel<<<grid_for(ceil_div(n, Vec<T>::N), kThreads), kThreads, 0, s>>>(y, a, n, aligned16(y));
  MT_CUDA_LAUNCH_CHECK();
}
template <typename TI, typename TO>
void cast(const TI* x, TO* y, int64_t n, cudaStream_t s) {
  if (!n) return;
  constexpr int G = Vec<TI>::N > Vec<TO>::N ? Vec<TI>::N : Vec<TO>::N;
  cast_kernel<<<grid_for(ceil_div(n, G), kThreads), kThreads, 0, s>>>(x, y, n, aligned16(x) && aligned16(y));
  MT_CUDA_LAUNCH_CHECK();
}

void philox_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, uint64_t first, cudaStream_t s) {
  if (!n) return;
  philox_uniform_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(out, n, seed, offset, first);
  MT_CUDA_LAUNCH_CHECK();
}
void rope_tables(int64_t seq, int64_t rot_dim, double base, float* cs, float* sn, cudaStream_t s) {
  MT_CHECK(rot_dim % 2 == 0 && rot_dim >= 0, "rotary dim must be even (got {})", rot_dim);
  if (seq * rot_dim == 0) return;
  rope_tables_kernel<<<grid_for(seq * rot_dim / 2, kThreads), kThreads, 0, s>>>(seq, rot_dim, base, cs, sn);
  MT_CUDA_LAUNCH_CHECK();
}

MT_INSTANTIATE_STORAGE(swiglu_forward);
MT_INSTANTIATE_STORAGE(swiglu_backward);
MT_INSTANTIATE_STORAGE(gelu_forward);
MT_INSTANTIATE_STORAGE(gelu_backward);
MT_INSTANTIATE_STORAGE(dropout_forward);
MT_INSTANTIATE_STORAGE(dropout_backward);
MT_INSTANTIATE_STORAGE(rope_forward);
MT_INSTANTIATE_STORAGE(rope_backward);
MT_INSTANTIATE_STORAGE2(add_inplace);
MT_INSTANTIATE(add_inplace, float, bf16);  // the fp32 accumulation of a half gradient
MT_INSTANTIATE(add_inplace, float, f16);
MT_INSTANTIATE_STORAGE(scale_inplace);
MT_INSTANTIATE(cast, float, bf16);
MT_INSTANTIATE(cast, float, f16);
MT_INSTANTIATE(cast, bf16, float);
MT_INSTANTIATE(cast, f16, float);

}  // namespace mt::cuda
