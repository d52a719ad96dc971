// The KV cache ops on the GPU (ops.def: kv_cache_write, cached_attention), tested against the
// CPU reference (kernels/cpu/kv_cache.cpp).
//
// cached_attention is single-query ("decode") attention over the cache, one query row at a time:
// a block per (row, head, key split), a warp per key in turn with each lane holding D/32 of the
// channels, an online softmax per warp merged across the block's warps in shared memory. At batch
// 1 there are only Hq rows of work, so the keys are split over several blocks (flash-decoding)
// whose partial results (max, sum, unnormalised output) a second kernel merges; with enough rows
// (prefill, large batches) one split writes the output directly. Prefill uses the same kernel:
// its rows simply have different positions.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/context.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/tensor_args.h"
#include "kernels/device.h"
#include "kernels/op_backends.h"

namespace mt::cuda {
namespace {

constexpr int kWarps = 8;     // warps per attention block
constexpr int kMaxChunks = 8;  // D <= 256: channels per lane
constexpr int kKeysPerIter = 2;  // keys a warp loads before reducing (independent loads in flight)

template <typename T>
__global__ void kv_write_kernel(T* __restrict__ kc, T* __restrict__ vc, const T* __restrict__ k,
                                const T* __restrict__ v, const int32_t* __restrict__ slot,
                                const int32_t* __restrict__ pos, int64_t N, int64_t slots, int64_t G, int64_t L,
                                int64_t D) {
  const int64_t i = blockIdx.x, g = blockIdx.y;
  const int64_t s = slot[i], p = pos[i];
  if (s < 0 || s >= slots || p < 0 || p >= L) return;  // the host checked; never write out of bounds
  const int64_t dst = ((s * G + g) * L + p) * D, src = (g * N + i) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    kc[dst + d] = k[src + d];
    vc[dst + d] = v[src + d];
  }
}

// Block (i, h, split): keys [split * per_split, min(pos + 1, (split + 1) * per_split)).
// splits == 1: writes out [N, Hq*D] directly; else partial results into part (per (i, h, split):
// D unnormalised outputs, then max, then sum).
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attention_kernel(const T* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,
                            const int32_t* __restrict__ slot, const int32_t* __restrict__ pos, T* __restrict__ out,
                            float* __restrict__ part, int64_t N, int64_t Hq, int64_t G, int64_t L, int64_t D,
                            int64_t slots, int splits, int64_t per_split, float scale) {
  allow_dependent_launch();
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const int split = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t s = slot[i], p = pos[i];
  const bool valid = s >= 0 && s < slots && p >= 0 && p < L;
  const int64_t g = h / (Hq / G);
  const int64_t begin = split * per_split, end = valid ? min(p + 1, begin + per_split) : begin;
  const T* kb = kc + (s * G + g) * L * D;
  const T* vb = vc + (s * G + g) * L * D;
  const int chunks = static_cast<int>((D + 31) / 32);
  float qv[kMaxChunks], acc[kMaxChunks];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t d = lane + 32 * c;
    qv[c] = c < chunks && d < D ? to_f(q[(h * N + i) * D + d]) * scale : 0.f;
    acc[c] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j0 = begin + warp * kKeysPerIter; j0 < end; j0 += kWarps * kKeysPerIter) {
    float dot[kKeysPerIter];
#pragma unroll
    for (int u = 0; u < kKeysPerIter; ++u) {
      const int64_t j = j0 + u;
      float part_dot = 0.f;
      if (j < end) {
#pragma unroll
        for (int c = 0; c < kMaxChunks; ++c) {
          const int64_t d = lane + 32 * c;
          if (c < chunks && d < D) part_dot += qv[c] * to_f(kb[j * D + d]);
        }
      }
      dot[u] = part_dot;
    }
#pragma unroll
    for (int u = 0; u < kKeysPerIter; ++u) dot[u] = warp_sum(dot[u]);
#pragma unroll
    for (int u = 0; u < kKeysPerIter; ++u) {
      const int64_t j = j0 + u;
      if (j >= end) break;
      const float m_new = fmaxf(m, dot[u]);
      const float corr = __expf(m - m_new), w = __expf(dot[u] - m_new);
      l = l * corr + w;
#pragma unroll
      for (int c = 0; c < kMaxChunks; ++c) {
        const int64_t d = lane + 32 * c;
        const float vv = c < chunks && d < D ? to_f(vb[j * D + d]) : 0.f;
        acc[c] = acc[c] * corr + w * vv;
      }
      m = m_new;
    }
  }
  // Merge the warps: each warp's (m, l, acc) into shared memory, then warp 0 combines.
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  extern __shared__ float sm_acc[];  // [kWarps][D]
  if (lane == 0) {
    sm_m[warp] = m;
    sm_l[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int64_t d = lane + 32 * c;
    if (c < chunks && d < D) sm_acc[warp * D + d] = acc[c];
  }
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w]);
  float Lsum = 0.f;
  float scale_w[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = sm_m[w] == -INFINITY ? 0.f : __expf(sm_m[w] - M);
    Lsum += sm_l[w] * scale_w[w];
  }
  const int64_t row = (i * Hq + h) * splits + split;
  for (int64_t d = lane; d < D; d += 32) {
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += sm_acc[w * D + d] * scale_w[w];
    if (splits == 1) out[i * Hq * D + h * D + d] = from_f<T>(Lsum > 0.f ? o / Lsum : 0.f);
    else part[row * (D + 2) + d] = o;
  }
  if (splits > 1 && lane == 0) {
    part[row * (D + 2) + D] = M;
    part[row * (D + 2) + D + 1] = Lsum;
  }
}

// One block per (row, head): merges the splits' partial results.
template <typename T>
__global__ void decode_merge_kernel(const float* __restrict__ part, T* __restrict__ out, int64_t Hq, int64_t D,
                                    int splits) {
  allow_dependent_launch();
  const int64_t i = blockIdx.x, h = blockIdx.y;
  const float* base = part + (i * Hq + h) * splits * (D + 2);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[i * Hq * D + h * D + d] = from_f<T>(merged_channel(base, d, D, splits));
}

// The decode kernel of ops::DecodeKernels (MT_DECODE_FUSED=1): a block is one team of
// decode_attention.cuh's grouped-query attention, for (row, key/value group, split). Same
// partial-result layout as decode_attention_kernel (decode_merge_kernel merges both); with
// `arrivals` set (the decode fusions, issue #22) the last split to arrive merges: no merge kernel.
struct BlockSync {
  __device__ void operator()() const { __syncthreads(); }
};

template <typename T, int LPK, int QMAX>
__global__ void __launch_bounds__(kGqaWarps * 32) decode_attention_gqa_kernel(GqaArgs<T> a) {
  allow_dependent_launch();
  const int64_t i = blockIdx.x, g = blockIdx.y;
  const int split = static_cast<int>(blockIdx.z);
  // Launched as a programmatic dependent of the QKV projection, whose epilogue writes q and the
  // new position's key and value: the older ones into L2 before the wait.
  gqa_prefetch<T, LPK>(a, i, g, split, static_cast<int>(threadIdx.x));
  wait_for_previous_grid();
  __shared__ GqaShared<QMAX, LPK * 8> sm;
  gqa_attend<T, LPK, QMAX>(a, i, g, split, static_cast<int>(threadIdx.x), sm, BlockSync{});
}

}  // namespace
}  // namespace mt::cuda

namespace mt::ops::gpu {
namespace {

struct CacheDims {
  int64_t slots, G, L, D;
};

CacheDims cache_dims(const Tensor& c, const Tensor& other, const char* what) {
  check_float_tensor(c, what);
  MT_CHECK(c.ndim() == 4 && other.shape() == c.shape() && other.dtype() == c.dtype(),
           "{}: caches {} and {} must both be [slots, G, L, D] of one dtype", what, c.shape_str(), other.shape_str());
  return {c.dim(0), c.dim(1), c.dim(2), c.dim(3)};
}

// The DecodeKernels path where it applies: half-precision caches, D 64 or 128, at most 8 query
// heads per group, 16-byte aligned q and caches. Returns false to leave the call to the default.
bool gqa_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const int32_t* sp,
                   const int32_t* pp, const CacheDims& c, float scale, Tensor& out) {
  const int64_t Hq = q.dim(1), N = q.dim(2), D = c.D, qpg = Hq / c.G;
  if (!DecodeKernels::active() || q.dtype() == DType::F32 || (D != 64 && D != 128) || qpg > 8 ||
      !cuda::aligned16(q.raw()) || !cuda::aligned16(k_cache.raw()) || !cuda::aligned16(v_cache.raw()))
    return false;
  MT_CHECK(c.G < 65536, "cached_attention: {} key/value groups exceed the grid", c.G);
  const int splits = cuda::gqa_splits(N * c.G, c.L, D, cuda::sm_count());
  const int64_t per_split = (c.L + splits - 1) / splits;
  cuda::Scratch part(splits > 1 ? static_cast<size_t>(N * Hq * splits * (D + 2)) * sizeof(float) : 0,
                     cuda::compute_stream());
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(c.G), static_cast<unsigned>(splits));
  // The split merge inside the attention kernel (the decode fusions, DecodeKernels::fusions()),
  // else the merge kernel.
  int* arrivals = splits > 1 && DecodeKernels::fusions()
                      ? cuda::arrival_counters(cuda::ArrivalUser::DecodeAttention, N * c.G, cuda::compute_stream())
                      : nullptr;
  with_float_type(q, [&](auto* qp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    if constexpr (!std::is_same_v<T, float>) {
      const cuda::GqaArgs<T> a{qp,    k_cache.data<T>(), v_cache.data<T>(), sp,        pp,    out.data<T>(),
                               part.as<float>(), N, Hq, c.G, c.L, c.slots, splits, per_split, scale, arrivals};
      auto launch = [&](auto kernel) {
        cuda::launch_dependent(kernel, grid, dim3(cuda::kGqaWarps * 32), cuda::compute_stream(), a);
      };
      if (D == 64 && qpg <= 4) launch(cuda::decode_attention_gqa_kernel<T, 8, 4>);
      else if (D == 64) launch(cuda::decode_attention_gqa_kernel<T, 8, 8>);
      else if (qpg <= 4) launch(cuda::decode_attention_gqa_kernel<T, 16, 4>);
      else launch(cuda::decode_attention_gqa_kernel<T, 16, 8>);
      if (splits > 1 && !arrivals) {
        const dim3 mgrid(static_cast<unsigned>(N), static_cast<unsigned>(Hq));
        cuda::decode_merge_kernel<T><<<mgrid, static_cast<unsigned>(D), 0, cuda::compute_stream()>>>(
            part.as<float>(), out.data<T>(), Hq, D, splits);
        MT_CUDA_LAUNCH_CHECK();
      }
    }
  });
  return true;
}

}  // namespace

void kv_cache_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& slot,
                    const Tensor& pos) {
  const CacheDims c = cache_dims(k_cache, v_cache, "kv_cache_write");
  MT_CHECK(k.ndim() == 4 && k.dim(0) == 1 && k.dim(1) == c.G && k.dim(3) == c.D && v.shape() == k.shape() &&
               k.dtype() == k_cache.dtype() && v.dtype() == k_cache.dtype(),
           "kv_cache_write: k {} / v {} must be [1, {}, N, {}] in the cache's dtype", k.shape_str(), v.shape_str(), c.G,
           c.D);
  const int64_t N = k.dim(2);
  if (N == 0) return;
  const int32_t* sp = cuda_data<int32_t>(slot, DType::I32, N, "kv_cache_write (slot)");
  const int32_t* pp = cuda_data<int32_t>(pos, DType::I32, N, "kv_cache_write (pos)");
  MT_CHECK(c.G < 65536, "kv_cache_write: {} key/value groups exceed the grid", c.G);
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(c.G));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, c.D)));
  with_float_type(k_cache, [&](auto* kc) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(kc)>>;
    cuda::kv_write_kernel<T><<<grid, threads, 0, cuda::compute_stream()>>>(
        kc, v_cache.data<T>(), k.data<T>(), v.data<T>(), sp, pp, N, c.slots, c.G, c.L, c.D);
    MT_CUDA_LAUNCH_CHECK();
  });
}

Tensor cached_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& slot,
                        const Tensor& pos, float scale) {
  const CacheDims c = cache_dims(k_cache, v_cache, "cached_attention");
  MT_CHECK(q.ndim() == 4 && q.dim(0) == 1 && q.dim(3) == c.D && q.dim(1) % c.G == 0 && q.dtype() == k_cache.dtype(),
           "cached_attention: q {} must be [1, Hq, N, {}] with Hq a multiple of {} groups, in the cache's dtype",
           q.shape_str(), c.D, c.G);
  MT_CHECK(c.D <= 32 * cuda::kMaxChunks, "cached_attention: head dim {} above {}", c.D, 32 * cuda::kMaxChunks);
  const int64_t Hq = q.dim(1), N = q.dim(2), D = c.D;
  Tensor out = Tensor::empty({N, Hq * D}, q.dtype(), Device::CUDA);
  if (N == 0) return out;
  MT_CHECK(Hq < 65536, "cached_attention: {} heads exceed the grid", Hq);
  const int32_t* sp = cuda_data<int32_t>(slot, DType::I32, N, "cached_attention (slot)");
  const int32_t* pp = cuda_data<int32_t>(pos, DType::I32, N, "cached_attention (pos)");
  if (gqa_attention(q, k_cache, v_cache, sp, pp, c, scale, out)) return out;
  // Split the keys over blocks only while rows x heads leave SMs idle, and never below 128 keys
  // per split (the positions are not known on the host: the cache's length bounds them).
  const int64_t blocks = N * Hq, want = 2 * static_cast<int64_t>(cuda::sm_count());
  int splits = 1;
  if (blocks < want) splits = static_cast<int>(std::min<int64_t>({(want + blocks - 1) / blocks, (c.L + 127) / 128, 64}));
  splits = std::max(splits, 1);
  const int64_t per_split = (c.L + splits - 1) / splits;
  cuda::Scratch part(splits > 1 ? static_cast<size_t>(N * Hq * splits * (D + 2)) * sizeof(float) : 0,
                     cuda::compute_stream());
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(Hq), static_cast<unsigned>(splits));
  const size_t smem = static_cast<size_t>(cuda::kWarps * D) * sizeof(float);
  with_float_type(q, [&](auto* qp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    cuda::decode_attention_kernel<T><<<grid, cuda::kWarps * 32, smem, cuda::compute_stream()>>>(
        qp, k_cache.data<T>(), v_cache.data<T>(), sp, pp, out.data<T>(), part.as<float>(), N, Hq, c.G, c.L, D,
        c.slots, splits, per_split, scale);
    MT_CUDA_LAUNCH_CHECK();
    if (splits > 1) {
      const dim3 mgrid(static_cast<unsigned>(N), static_cast<unsigned>(Hq));
      cuda::decode_merge_kernel<T><<<mgrid, static_cast<unsigned>(std::min<int64_t>(256, ((D + 31) / 32) * 32)), 0,
                                     cuda::compute_stream()>>>(part.as<float>(), out.data<T>(), Hq, D, splits);
      MT_CUDA_LAUNCH_CHECK();
    }
  });
  return out;
}

}  // namespace mt::ops::gpu
