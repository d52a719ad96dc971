// Mixture-of-experts token permutation on the GPU: moe_permute, moe_unpermute and their
// backwards, and the shared expert's sigmoid_gate_rows (ops.def; CPU reference in
// kernels/cpu/moe_ops.cpp). Activations are bf16, fp16 or f32; probs and dprobs f32. A block
// per token: its dispatch rows (token_rows[t, :], experts ascending) gathered into shared
// memory, then whole rows moved in 16-byte vectors where h and the pointers allow. Sums over a
// token's rows run in fp32, experts ascending (the CPU's order), rounded once to the storage
// type; dot products are fixed block reductions. Gathers only: no atomics, deterministic.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/tensor_args.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// Threads for a block that walks `groups` per row: a multiple of 32 (warp 0 gathers the token's
// rows), at most 256 (more tokens per SM rather than longer rows per block).
int row_threads(int64_t groups) {
  return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, ceil_div(groups, 32) * 32)));
}

// Token t's routed experts in ascending order, gathered by warp 0 with ballots into the shared
// arrays: rows[i] (the dispatch row), p[i] (its prob, when probs_t is given) and e[i] (the
// expert, when asked). Returns how many, to every thread. A row outside [0, nrows) counts as
// absent rather than being written out of bounds. Where dprobs_t is given, warp 0 also writes
// 0 at the experts the token does not go to.
struct TokenRows {
  int32_t* rows;
  float* p;
  int32_t* e;
};
__device__ TokenRows token_rows_shared(int32_t* sh, int64_t E) {
  return {sh, reinterpret_cast<float*>(sh + E), sh + 2 * E};
}
__device__ int gather_token_rows(const int32_t* rows_t, const float* probs_t, int64_t E, int64_t nrows,
                                 const TokenRows& out, bool with_e, float* dprobs_t) {
  __shared__ int count;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int cnt = 0;
    for (int64_t base = 0; base < E; base += 32) {
      const int64_t e = base + lane;
      const int32_t r = e < E ? rows_t[e] : -1;
      const bool on = r >= 0 && r < nrows;
      const unsigned bits = __ballot_sync(kFull, on);
      if (on) {
        const int pos = cnt + __popc(bits & ((1u << lane) - 1u));
        out.rows[pos] = r;
        out.p[pos] = probs_t ? probs_t[e] : 1.f;
        if (with_e) out.e[pos] = static_cast<int32_t>(e);
      } else if (dprobs_t && e < E) {
        dprobs_t[e] = 0.f;
      }
      cnt += __popc(bits);
    }
    if (lane == 0) count = cnt;
  }
  __syncthreads();
  return count;
}

// ---- moe_permute: x[t] copied to each of its dispatch rows (a pure copy: raw 16-byte vectors).
template <typename T>
__global__ void permute_kernel(const T* __restrict__ x, T* __restrict__ xp, const int32_t* __restrict__ token_rows,
                               int64_t E, int64_t nrows, int64_t h, bool vec) {
  extern __shared__ int32_t moe_sh[];
  const int64_t t = blockIdx.x;
  const TokenRows list = token_rows_shared(moe_sh, E);
  const int cnt = gather_token_rows(token_rows + t * E, nullptr, E, nrows, list, false, nullptr);
  if (vec) {
    const int64_t groups = h / Vec<T>::N;
    const uint4* src = reinterpret_cast<const uint4*>(x + t * h);
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      const uint4 v = src[g];
      for (int i = 0; i < cnt; ++i) reinterpret_cast<uint4*>(xp + static_cast<int64_t>(list.rows[i]) * h)[g] = v;
    }
  } else {
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const T v = x[t * h + j];
      for (int i = 0; i < cnt; ++i) xp[static_cast<int64_t>(list.rows[i]) * h + j] = v;
    }
  }
}

// ---- moe_unpermute (probs given) and moe_permute_backward (probs null: weights 1):
// out[t] = sum over the token's rows i, experts ascending, of p_i * src[row_i], in fp32.
template <typename T>
__global__ void gather_sum_kernel(const T* __restrict__ src, const int32_t* __restrict__ token_rows,
                                  const float* __restrict__ probs, T* __restrict__ out, int64_t E, int64_t nrows,
                                  int64_t h, bool vec) {
  constexpr int N = Vec<T>::N;
  extern __shared__ int32_t moe_sh[];
  const int64_t t = blockIdx.x;
  const TokenRows list = token_rows_shared(moe_sh, E);
  const int cnt = gather_token_rows(token_rows + t * E, probs ? probs + t * E : nullptr, E, nrows, list, false,
                                    nullptr);
  for (int64_t j0 = threadIdx.x * N; j0 < h; j0 += static_cast<int64_t>(blockDim.x) * N) {
    const int c = h - j0 < N ? static_cast<int>(h - j0) : N;
    float acc[N] = {};
    for (int i = 0; i < cnt; ++i) {
      float v[N] = {};
      load_group(src + static_cast<int64_t>(list.rows[i]) * h + j0, c, vec, v);
      const float p = list.p[i];
#pragma unroll
      for (int e = 0; e < N; ++e) acc[e] += p * v[e];
    }
    store_group(out + t * h + j0, c, vec, acc);
  }
}

// ---- moe_unpermute_backward: for each of the token's rows, dyp[row] = p * dy[t] and
// dprobs[t, e] = <dy[t], yp[row]> (fp32, a fixed block reduction); 0 off the map.
template <typename T>
__global__ void unpermute_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ yp,
                                     const int32_t* __restrict__ token_rows, const float* __restrict__ probs,
                                     T* __restrict__ dyp, float* __restrict__ dprobs, int64_t E, int64_t nrows,
                                     int64_t h, bool vec) {
  constexpr int N = Vec<T>::N;
  extern __shared__ int32_t moe_sh[];
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const TokenRows list = token_rows_shared(moe_sh, E);
  const int cnt = gather_token_rows(token_rows + t * E, probs + t * E, E, nrows, list, true, dprobs + t * E);
  const T* g = dy + t * h;
  for (int i = 0; i < cnt; ++i) {
    const int64_t r = list.rows[i];
    const float p = list.p[i];
    float dot = 0.f;
    for (int64_t j0 = threadIdx.x * N; j0 < h; j0 += static_cast<int64_t>(blockDim.x) * N) {
      const int c = h - j0 < N ? static_cast<int>(h - j0) : N;
      float d[N] = {}, y[N] = {}, o[N];
      load_group(g + j0, c, vec, d);
      load_group(yp + r * h + j0, c, vec, y);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        dot += d[e] * y[e];  // zeros past the row's end
        o[e] = p * d[e];
      }
      store_group(dyp + r * h + j0, c, vec, o);
    }
    dot = block_sum(dot, red);
    if (threadIdx.x == 0) dprobs[t * E + list.e[i]] = dot;
  }
}

// ---- sigmoid_gate_rows: y[t] = x[t] * sigmoid(gate[t]); the backward writes dx = dy * s and
// dgate[t] = <dy[t], x[t]> * s * (1 - s) (fp32, a fixed block reduction). Gate: f32 or x's type.
template <typename G>
__device__ __forceinline__ float gate_sigmoid(const G* gate, int64_t t) {
  return 1.f / (1.f + expf(-to_f(gate[t])));
}
template <typename T, typename G>
__global__ void sigmoid_gate_kernel(const T* __restrict__ x, const G* __restrict__ gate, T* __restrict__ y, int64_t h,
                                    bool vec) {
  constexpr int N = Vec<T>::N;
  const int64_t t = blockIdx.x;
  const float s = gate_sigmoid(gate, t);
  for (int64_t j0 = threadIdx.x * N; j0 < h; j0 += static_cast<int64_t>(blockDim.x) * N) {
    const int c = h - j0 < N ? static_cast<int>(h - j0) : N;
    float v[N] = {};
    load_group(x + t * h + j0, c, vec, v);
#pragma unroll
    for (int e = 0; e < N; ++e) v[e] *= s;
    store_group(y + t * h + j0, c, vec, v);
  }
}
template <typename T, typename G>
__global__ void sigmoid_gate_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const G* __restrict__ gate,
                                        T* __restrict__ dx, float* __restrict__ dgate, int64_t h, bool vec) {
  constexpr int N = Vec<T>::N;
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float s = gate_sigmoid(gate, t);
  float dot = 0.f;
  for (int64_t j0 = threadIdx.x * N; j0 < h; j0 += static_cast<int64_t>(blockDim.x) * N) {
    const int c = h - j0 < N ? static_cast<int>(h - j0) : N;
    float d[N] = {}, v[N] = {};
    load_group(dy + t * h + j0, c, vec, d);
    load_group(x + t * h + j0, c, vec, v);
#pragma unroll
    for (int e = 0; e < N; ++e) {
      dot += d[e] * v[e];
      d[e] *= s;
    }
    store_group(dx + t * h + j0, c, vec, d);
  }
  dot = block_sum(dot, red);
  if (threadIdx.x == 0) dgate[t] = dot * s * (1.f - s);
}

// ---- Launchers: a block per token (n < 2^31 blocks), row_threads over its row's groups.
template <typename T>
bool rows_vec(int64_t h, std::initializer_list<const void*> ptrs) {
  if (h % Vec<T>::N) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}
size_t list_bytes(int64_t E) { return static_cast<size_t>(3 * E) * sizeof(int32_t); }
void check_tokens(int64_t n, int64_t E, const char* what) {
  MT_CHECK(n < (int64_t{1} << 31), "{}: {} tokens exceed the grid", what, n);
  MT_CHECK(list_bytes(E) <= (48 << 10), "{}: {} experts exceed the shared memory of a block", what, E);
}
template <typename T>
int threads_for(int64_t h) {
  return row_threads(ceil_div(h, Vec<T>::N));
}

template <typename T>
void permute(const T* x, T* xp, const int32_t* token_rows, int64_t n, int64_t E, int64_t nrows, int64_t h,
             cudaStream_t s) {
  if (n == 0 || h == 0) return;
  check_tokens(n, E, "moe_permute");
  const bool vec = rows_vec<T>(h, {x, xp});
  permute_kernel<<<static_cast<unsigned>(n), vec ? threads_for<T>(h) : row_threads(h), list_bytes(E), s>>>(
      x, xp, token_rows, E, nrows, h, vec);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void gather_sum(const T* src, const int32_t* token_rows, const float* probs, T* out, int64_t n, int64_t E,
                int64_t nrows, int64_t h, cudaStream_t s) {
  if (n == 0 || h == 0) return;
  check_tokens(n, E, probs ? "moe_unpermute" : "moe_permute_backward");
  const bool vec = rows_vec<T>(h, {src, out});
  gather_sum_kernel<<<static_cast<unsigned>(n), threads_for<T>(h), list_bytes(E), s>>>(src, token_rows, probs, out,
                                                                                       E, nrows, h, vec);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T>
void unpermute_backward(const T* dy, const T* yp, const int32_t* token_rows, const float* probs, T* dyp,
                        float* dprobs, int64_t n, int64_t E, int64_t nrows, int64_t h, cudaStream_t s) {
  if (n == 0) return;  // h == 0 still writes dprobs (zeros)
  check_tokens(n, E, "moe_unpermute_backward");
  const bool vec = rows_vec<T>(h, {dy, yp, dyp});
  unpermute_bwd_kernel<<<static_cast<unsigned>(n), threads_for<T>(h), list_bytes(E), s>>>(
      dy, yp, token_rows, probs, dyp, dprobs, E, nrows, h, vec);
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T, typename G>
void sigmoid_gate(const T* x, const G* gate, T* y, int64_t n, int64_t h, cudaStream_t s) {
  if (n == 0 || h == 0) return;
  check_tokens(n, 0, "sigmoid_gate_rows");
  sigmoid_gate_kernel<<<static_cast<unsigned>(n), threads_for<T>(h), 0, s>>>(x, gate, y, h, rows_vec<T>(h, {x, y}));
  MT_CUDA_LAUNCH_CHECK();
}

template <typename T, typename G>
void sigmoid_gate_backward(const T* dy, const T* x, const G* gate, T* dx, float* dgate, int64_t n, int64_t h,
                           cudaStream_t s) {
  if (n == 0) return;  // h == 0 still writes dgate (zeros)
  check_tokens(n, 0, "sigmoid_gate_rows_backward");
  sigmoid_gate_bwd_kernel<<<static_cast<unsigned>(n), threads_for<T>(h), 0, s>>>(dy, x, gate, dx, dgate, h,
                                                                                 rows_vec<T>(h, {dy, x, dx}));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {
namespace {

using cuda::compute_stream;

// The element type behind with_float_type's pointer.
template <typename P>
using elem_t = std::remove_const_t<std::remove_pointer_t<P>>;

// An activation [rows, h] on the GPU in a float type; returns h.
int64_t check_rows(const Tensor& t, const char* what) {
  check_float_tensor(t, what);
  MT_CHECK(t.ndim() == 2, "{}: expected [rows, hidden], got {}", what, t.shape_str());
  return t.dim(1);
}
// token_rows I32 [n, E]; returns E.
int64_t check_token_rows(const Tensor& token_rows, int64_t n, const char* what) {
  MT_CHECK(token_rows.ndim() == 2 && token_rows.dim(0) == n, "{}: token_rows {} for {} tokens", what,
           token_rows.shape_str(), n);
  check_cuda_tensor(token_rows, DType::I32, what);
  return token_rows.dim(1);
}
// Another activation of t's dtype and shape `shape`.
void check_like(const Tensor& other, const Tensor& t, const Shape& shape, const char* what) {
  MT_CHECK(other.device() == Device::CUDA && other.dtype() == t.dtype() && other.shape() == shape,
           "{}: expected a CUDA {} tensor of shape {}, got {} {}", what, dtype_name(t.dtype()), shape_to_string(shape),
           dtype_name(other.dtype()), other.shape_str());
}

// Calls f(gate pointer) with the gate as f32 or as T (x's type).
template <typename T, typename F>
void with_gate(const Tensor& gate, int64_t n, F&& f) {
  MT_CHECK(gate.numel() == n && gate.device() == Device::CUDA, "sigmoid_gate_rows: gate {} for {} rows",
           gate.shape_str(), n);
  if (gate.dtype() == DType::F32) {
    f(gate.data<float>());
  } else {
    with_float_type(gate, [&](auto* g) {
      if constexpr (std::is_same_v<elem_t<decltype(g)>, T>) {
        f(g);
      } else {
        MT_CHECK(false, "sigmoid_gate_rows: a {} gate for activations of another type", dtype_name(gate.dtype()));
      }
    });
  }
}

}  // namespace

Tensor moe_permute(const Tensor& x, const Tensor& token_rows, int64_t rows) {
  const int64_t h = check_rows(x, "moe_permute"), n = x.dim(0);
  const int64_t E = check_token_rows(token_rows, n, "moe_permute");
  MT_CHECK(rows >= 0, "moe_permute: {} rows", rows);
  Tensor xp = Tensor::empty({rows, h}, x.dtype(), Device::CUDA);
  with_float_type(x, [&](auto* px) {
    using T = elem_t<decltype(px)>;
    cuda::permute<T>(px, xp.data<T>(), token_rows.data<int32_t>(), n, E, rows, h, compute_stream());
  });
  return xp;
}

Tensor moe_permute_backward(const Tensor& dxp, const Tensor& token_rows) {
  const int64_t h = check_rows(dxp, "moe_permute_backward"), n = token_rows.dim(0);
  const int64_t E = check_token_rows(token_rows, n, "moe_permute_backward");
  Tensor dx = Tensor::empty({n, h}, dxp.dtype(), Device::CUDA);
  with_float_type(dxp, [&](auto* p) {
    using T = elem_t<decltype(p)>;
    cuda::gather_sum<T>(p, token_rows.data<int32_t>(), nullptr, dx.data<T>(), n, E, dxp.dim(0), h, compute_stream());
  });
  return dx;
}

Tensor moe_unpermute(const Tensor& yp, const Tensor& token_rows, const Tensor& probs) {
  const int64_t h = check_rows(yp, "moe_unpermute"), n = token_rows.dim(0);
  const int64_t E = check_token_rows(token_rows, n, "moe_unpermute");
  const float* pr = cuda_data<float>(probs, DType::F32, n * E, "moe_unpermute (probs)");
  Tensor y = Tensor::empty({n, h}, yp.dtype(), Device::CUDA);
  with_float_type(yp, [&](auto* p) {
    using T = elem_t<decltype(p)>;
    cuda::gather_sum<T>(p, token_rows.data<int32_t>(), pr, y.data<T>(), n, E, yp.dim(0), h, compute_stream());
  });
  return y;
}

Tensor moe_unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& token_rows, const Tensor& probs,
                              Tensor& dprobs) {
  const int64_t h = check_rows(yp, "moe_unpermute_backward"), n = token_rows.dim(0);
  const int64_t E = check_token_rows(token_rows, n, "moe_unpermute_backward");
  check_like(dy, yp, {n, h}, "moe_unpermute_backward (dy)");
  const float* pr = cuda_data<float>(probs, DType::F32, n * E, "moe_unpermute_backward (probs)");
  Tensor dyp = Tensor::empty(yp.shape(), yp.dtype(), Device::CUDA);
  dprobs = Tensor::empty({n, E}, DType::F32, Device::CUDA);
  with_float_type(yp, [&](auto* p) {
    using T = elem_t<decltype(p)>;
    cuda::unpermute_backward<T>(dy.data<T>(), p, token_rows.data<int32_t>(), pr, dyp.data<T>(), dprobs.data<float>(),
                                n, E, yp.dim(0), h, compute_stream());
  });
  return dyp;
}

Tensor sigmoid_gate_rows(const Tensor& x, const Tensor& gate) {
  const int64_t h = check_rows(x, "sigmoid_gate_rows"), n = x.dim(0);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  with_float_type(x, [&](auto* px) {
    using T = elem_t<decltype(px)>;
    with_gate<T>(gate, n, [&](auto* g) { cuda::sigmoid_gate<T>(px, g, y.data<T>(), n, h, compute_stream()); });
  });
  return y;
}

Tensor sigmoid_gate_rows_backward(const Tensor& dy, const Tensor& x, const Tensor& gate, Tensor& dgate) {
  const int64_t h = check_rows(x, "sigmoid_gate_rows_backward"), n = x.dim(0);
  check_like(dy, x, x.shape(), "sigmoid_gate_rows_backward (dy)");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  dgate = Tensor::empty({n, 1}, DType::F32, Device::CUDA);
  with_float_type(x, [&](auto* px) {
    using T = elem_t<decltype(px)>;
    with_gate<T>(gate, n, [&](auto* g) {
      cuda::sigmoid_gate_backward<T>(dy.data<T>(), px, g, dx.data<T>(), dgate.data<float>(), n, h, compute_stream());
    });
  });
  return dx;
}

}  // namespace mt::ops::gpu
