// The linear layer for a handful of rows (M <= kGemvMaxRows): generation's decode steps, where
// every sequence adds one row. Why a kernel of our own: at M = 1..16 a linear layer is a
// matrix-vector product whose time is the weight matrix streaming out of HBM once, and
// cuBLASLt's plans for these shapes (tensor-core tiles of 64+ rows, split-K with a reduction
// pass) reach well under half the memory bandwidth; with every layer's linears below the bound,
// decode at batch 1 ran at 0.4 of it (issue #22). Here each warp owns one output column n (a
// weight row, [N, K] row-major as the model stores it), streams that row with 16-byte loads
// that bypass L1 (read once), and multiplies each 8-element chunk into all M rows of x at once
// (x is small and stays in L1/L2), accumulating in fp32; a butterfly sum across the warp, then
// the bias and the residual in fp32 and one rounding to y's type, as cuBLASLt's epilogue.
// Between kernels: a decode step is ~180 small kernels, and a GEMV of a few MB lasts a few
// microseconds, so the gap before each matters. On Hopper the GEMV is launched as a programmatic
// dependent launch: its blocks may start while the kernel before it drains, prefetch their weight
// rows into L2 (the weights do not depend on that kernel), and only then wait for it
// (griddepcontrol.wait: its completion and the visibility of its writes) before reading x.
// gemm.cu's forward picks this kernel (gemv_applies) only while an InferenceGemv scope is open
// (kernels/device.h), so training keeps cuBLASLt's results.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {
namespace {

constexpr int kWarps = 4;   // warps (output columns) per block
constexpr int kUnroll = 4;  // 16-byte weight loads in flight per lane

std::atomic<int64_t> calls{0};

// The weights are read exactly once: a streaming load that does not allocate in L1, leaving it
// to x, which every warp of the SM reads.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// Waits for the grid this one depends on programmatically (a no-op when launched normally).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

constexpr int64_t kPrefetchBytes = 16 * 1024;  // of each weight row, before the wait (K <= 8192 in bf16: all)

// MR: the rows of x this instantiation handles (M <= MR; rows m >= M are skipped). V: elements
// per load (Vec<T>::N when K is a multiple of it and x, w are 16-byte aligned, else 1).
template <typename TI, typename TO, int MR, int V>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const TI* __restrict__ x, const TI* __restrict__ w, const TO* __restrict__ b, const TO* residual,
                TO* y, int M, int64_t N, int64_t K) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // a whole warp: the shuffles below see full warps only
  const TI* wr = w + n * K;
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(TI));
  for (int64_t off = lane * 128; off < row_bytes && off < kPrefetchBytes; off += 32 * 128)
    prefetch_l2(reinterpret_cast<const char*>(wr) + off);
  wait_for_previous_grid();  // x, b and residual come from the kernels before
  const int64_t chunks = K / V;
  float acc[MR];
#pragma unroll
  for (int m = 0; m < MR; ++m) acc[m] = 0.f;
  for (int64_t c0 = 0; c0 < chunks; c0 += 32 * kUnroll) {
    float wv[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load issued before any is used
      const int64_t c = c0 + u * 32 + lane;
      if constexpr (V == 1) {
        wv[u][0] = c < chunks ? to_f(wr[c]) : 0.f;
      } else if (c < chunks) {
        Vec<TI>::unpack(load_stream(wr + c * V), wv[u]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) wv[u][e] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + u * 32 + lane;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m >= M) break;
        float xv[V];
        if constexpr (V == 1)
          xv[0] = to_f(x[m * K + c]);
        else
          Vec<TI>::unpack(__ldg(reinterpret_cast<const uint4*>(x + m * K + c * V)), xv);
#pragma unroll
        for (int e = 0; e < V; ++e) acc[m] = fmaf(wv[u][e], xv[e], acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < MR; ++m) {
    if (m >= M) break;
    const float s = warp_sum(acc[m]);
    if (lane == m % 32) {
      float v = s;
      if (b) v += to_f(b[n]);
      if (residual) v += to_f(residual[m * N + n]);
      y[m * N + n] = from_f<TO>(v);
    }
  }
}

// Programmatic dependent launches need compute capability 9.0 (Hopper) or newer.
bool dependent_launch() {
  static const bool on = [] {
    int dev = 0, major = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return on;
}

template <typename TI, typename TO, int MR>
void launch(const TI* x, const TI* w, const TO* b, const TO* residual, TO* y, int64_t M, int64_t N, int64_t K,
            cudaStream_t s) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ceil_div(N, kWarps)));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent_launch() ? 1 : 0;
  const bool vec = K % Vec<TI>::N == 0 && aligned16(x) && aligned16(w);
  const int m = static_cast<int>(M);
  if (vec)
    MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<TI, TO, MR, Vec<TI>::N>, x, w, b, residual, y, m, N, K));
  else
    MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemv_kernel<TI, TO, MR, 1>, x, w, b, residual, y, m, N, K));
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

template <typename TI, typename TO>
void gemv_forward(const TI* x, const nd<TI>* w, const nd<TO>* b, const nd<TO>* residual, TO* y, int64_t M, int64_t N,
                  int64_t K, cudaStream_t s) {
  static_assert(!std::is_same_v<TI, float>, "the GEMV reads half-precision weights");
  MT_CHECK(M >= 0 && M <= kGemvMaxRows && N >= 0 && K >= 0, "gemv_forward: {} x {} x {} (at most {} rows)", M, N, K,
           kGemvMaxRows);
  MT_CHECK(N < (int64_t{1} << 31) * kWarps, "gemv_forward: {} output columns exceed the grid", N);
  if (M == 0 || N == 0) return;
  calls.fetch_add(1, std::memory_order_relaxed);
  // The smallest instantiation that holds M rows: its accumulators stay in registers.
  if (M == 1)
    launch<TI, TO, 1>(x, w, b, residual, y, M, N, K, s);
  else if (M == 2)
    launch<TI, TO, 2>(x, w, b, residual, y, M, N, K, s);
  else if (M <= 4)
    launch<TI, TO, 4>(x, w, b, residual, y, M, N, K, s);
  else if (M <= 8)
    launch<TI, TO, 8>(x, w, b, residual, y, M, N, K, s);
  else
    launch<TI, TO, 16>(x, w, b, residual, y, M, N, K, s);
}

int64_t gemv_calls() { return calls.load(std::memory_order_relaxed); }

MT_INSTANTIATE(gemv_forward, bf16, bf16);
MT_INSTANTIATE(gemv_forward, f16, f16);
MT_INSTANTIATE(gemv_forward, bf16, float);

}  // namespace mt::cuda
