// The linear layer for a handful of rows (M <= kGemvMaxRows): generation's decode steps, where
// every sequence adds one row. Why a kernel of our own: at M = 1..16 a linear layer is a
// matrix-vector product whose time is the weight matrix streaming out of HBM once, and
// cuBLASLt's plans for these shapes (tensor-core tiles of 64+ rows, split-K with a reduction
// pass) reach well under half the memory bandwidth; with every layer's linears below the bound,
// decode at batch 1 ran at 0.4 of it (issue #22). Here each output column n (a weight row, [N, K]
// row-major as the model stores it) belongs to one warp, or to WPC warps of a block that each
// take a share of the row (split-K in the block, summed in a fixed order); lanes stream the row
// with 16-byte loads that bypass L1 (read once), U of them in flight per lane, and multiply each
// 8-element chunk into all M rows of x at once (x is small and stays in L1/L2), accumulating in
// fp32; a butterfly sum across the warp, then the bias and the residual in fp32 and one rounding
// to y's type, as cuBLASLt's epilogue.
//
// Two kernels (InferenceGemv::Kernel, chosen by inference::ModelRunner from MT_GEMV_KERNEL, to be
// A/B'd on the GPU): Base (one warp per column, U = 4: the kernel measured in session 16) and
// Wide (the default, U = 8 and, for rows of more than 2,048 elements, 4 warps per column).
// Why Wide: a warp's row is loaded in rounds of 32 x U x 16 bytes, each round a full memory
// latency. With U = 4 a 2,048-element row (QKV, proj, fc1, the output layer) takes 2 rounds and
// fc2's 8,192-element row 8 (its 512 blocks keep only ~4 MB in flight, under the ~6-8 MB that
// H200's bandwidth x latency asks for); with U = 8 a 2,048 row is one round, and fc2's 2,048
// blocks of 4 warps (each a quarter row, one round) all fit on the SMs at once: one round.
//
// Between kernels: a decode step is ~85-180 small kernels, and a GEMV of a few MB lasts a few
// microseconds, so the gap before each matters. On Hopper the GEMV is launched as a programmatic
// dependent launch: its blocks may start while the kernel before it drains, issue their first
// round of weight loads and prefetch the rest of their rows into L2 (the weights do not depend
// on that kernel), and only then wait for it (griddepcontrol.wait: its completion and the
// visibility of its writes) before reading x. The GEMV itself lets its dependents start as soon
// as all its blocks have (griddepcontrol.launch_dependents): with the norms and SwiGLU fused
// away, a decode layer's GEMVs mostly follow one another (proj -> fc1 -> fc2 -> next QKV).
//
// The decode fusions (ops::fused_linear_forward, issue #22), each computing what the unfused
// ops would have stored, bit for bit:
//  - NORM: x is RMSNorm's input; each warp recomputes its rows' rstd from x (a few KB, L1/L2
//    resident) with rmsnorm_forward's summation order (norms.cu's one-warp kernel), and reads x as
//    round(x * rstd * gamma), as that kernel stores it. Saves the norm's kernel and its output.
//  - Out::SwiGlu: w is fc1's [gate; up] (2F rows) and y [M, F] is swiglu(x w^T): a warp owns
//    columns j and j + F, rounds both to y's type (as fc1's output is stored), then writes
//    silu(g) * u rounded. Saves SwiGLU's kernel and the [M, 2F] intermediate. (Fusing SwiGLU into
//    fc2's x load instead would evaluate silu once per output column: 2,048 x 8,192 sigmoids per
//    layer, ~4 us of SFU time on an H200, more than fc2's memory time; here it is F per layer.)
//  - Out::Qkv: w is linear_qkv's; a warp owns column d of a packed head and its RoPE partner
//    d + D/2, rounds both as linear_qkv's output is stored, rotates them as qkv_split does, and
//    writes q, or k and v into the KV caches at the row's slot and position (ops::fused_qkv_forward).
//    Saves the split kernel (ops::qkv_split_to_cache) and the packed intermediate.
// gemm.cu's forward picks the GEMV (gemv_applies) only while an InferenceGemv scope is open
// (kernels/device.h), so training keeps cuBLASLt's results.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/device.h"

namespace mt::cuda {
namespace {

using namespace gemv;

constexpr int kWarps = 4;  // warps per block
constexpr int64_t kPrefetchBytes = 16 * 1024;  // of each weight row, before the wait (K <= 8192 in bf16: all)

std::atomic<int64_t> calls{0};

// The 16-byte path (K % 8 == 0, x and w 16-byte aligned). MR: the rows of x this instantiation
// handles (M <= MR). WPC warps per output column, U loads in flight per lane and weight row.
// OUT: what the warp's columns become (Out, above); SwiGlu and Qkv give each warp two weight rows.
template <typename TI, typename TO, int MR, bool NORM, Out OUT, int WPC, int U>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const TI* __restrict__ x, const TI* __restrict__ gamma, float eps, const TI* __restrict__ w,
                const TO* __restrict__ b, const TO* residual, TO* y, int M, int64_t N, int64_t K, GemvQkvOut qkv) {
  // The next GEMV (a programmatic dependent) may start its blocks once all of this one's have
  // started: its first loads and prefetches then overlap this one's tail (it still waits for
  // this grid's completion before reading x).
  allow_dependent_launch();
  // NORM: x normalised once per block (rounded as norms.cu stores it), then read from here.
  __shared__ __align__(16) TI xs[NORM ? MR * kNormMaxK : Vec<TI>::N];
  constexpr int V = Vec<TI>::N, R = OUT == Out::Plain ? 1 : 2, kCols = kWarps / WPC;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, part = warp % WPC;
  const int64_t cols = N / R;  // the warps' work items: columns, or pairs of them
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kCols + warp / WPC;
  // With WPC > 1 the block meets at a barrier below: a warp past the last column stays, idle.
  const bool live = n < cols;
  // A whole warp: the shuffles below see full warps only (NORM's dead warps leave after its barrier).
  if (WPC == 1 && !live && !NORM) return;
  const int64_t chunks = K / V, step = static_cast<int64_t>(WPC) * 32 * U;
  int64_t col[R];
  item_rows<OUT, R>(n, cols, qkv, col);
  const TI* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + (live ? col[r] : 0) * K;
  uint4 raw[R][U];
  int64_t c0 = static_cast<int64_t>(part) * 32 * U;
  // Before the wait (the weights do not depend on the kernel before): this warp's later rounds
  // into L2, 128-byte lines, and its first round into registers.
  if (live) {
    for (int64_t cb = c0 + step; cb < chunks && (cb - c0) * 16 < kPrefetchBytes; cb += step)
      for (int l = lane; l < 4 * U; l += 32)
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (cb * V + l * (128 / static_cast<int>(sizeof(TI))) < K)
            prefetch_l2(wr[r] + cb * V + l * (128 / static_cast<int>(sizeof(TI))));
  }
  load_round<TI, R>(raw, wr, c0, chunks, live, lane);
  wait_for_previous_grid();  // x, b and residual come from the kernels before
  if constexpr (NORM) {
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m >= M) break;
      // Every warp finds rstd in norms.cu's order (a few KB from L1/L2), then the block writes x's
      // normalised rows, as rmsnorm_forward would have stored them.
      const float rs = row_rstd(x + m * K, K, eps, lane);
      for (int64_t vi = threadIdx.x; vi < K / V; vi += kWarps * 32) {
        float xv[V], gv[V];
        Vec<TI>::load(x + m * K + vi * V, xv);
        Vec<TI>::load(gamma + vi * V, gv);
#pragma unroll
        for (int e = 0; e < V; ++e) xv[e] = (xv[e] * rs) * gv[e];
        Vec<TI>::store(xs + m * K + vi * V, xv);
      }
    }
    __syncthreads();
    if (WPC == 1 && !live) return;
  }
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;
  while (c0 < chunks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32 + lane;
      if (c >= chunks) break;
      float wf[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) Vec<TI>::unpack(raw[r][u], wf[r]);
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m >= M) break;
        float xv[V];
        if constexpr (NORM)
          Vec<TI>::load(xs + m * K + c * V, xv);
        else
          Vec<TI>::unpack(__ldg(reinterpret_cast<const uint4*>(x + m * K + c * V)), xv);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r][m] = fmaf(wf[r][e], xv[e], acc[r][m]);
      }
    }
    c0 += step;
    if (c0 < chunks) load_round<TI, R>(raw, wr, c0, chunks, live, lane);
  }
  float sum[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) sum[r][m] = m < M ? warp_sum(acc[r][m]) : 0.f;
  if constexpr (WPC > 1) {  // the column's warps' shares, added in warp order
    __shared__ float red[kWarps][R][MR];
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) red[warp][r][m] = sum[r][m];
    __syncthreads();
    if (part != 0 || !live) return;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        float s = red[warp][r][m];
#pragma unroll
        for (int j = 1; j < WPC; ++j) s += red[warp + j][r][m];
        sum[r][m] = s;
      }
  }
  store_item<TO, MR, OUT, R>(sum, n, col[0], cols, N, b, residual, y, qkv, M, lane);
}

// Any K and alignment (one element per load), no fusions: the rare shapes off the 16-byte path.
template <typename TI, typename TO, int MR>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_scalar_kernel(const TI* __restrict__ x, const TI* __restrict__ w, const TO* __restrict__ b,
                       const TO* residual, TO* y, int M, int64_t N, int64_t K) {
  allow_dependent_launch();
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const TI* wr = w + n * K;
  wait_for_previous_grid();
  float acc[MR];
#pragma unroll
  for (int m = 0; m < MR; ++m) acc[m] = 0.f;
  for (int64_t c = lane; c < K; c += 32) {
    const float wv = to_f(wr[c]);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      if (m >= M) break;
      acc[m] = fmaf(wv, to_f(x[m * K + c]), acc[m]);
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

// The 16-byte kernel in the variant the open InferenceGemv scope asks for.
template <typename TI, typename TO, int MR, bool NORM, Out OUT>
void launch_vec(const TI* x, const TI* gamma, float eps, const TI* w, const TO* b, const TO* residual, TO* y,
                int64_t M, int64_t N, int64_t K, const GemvQkvOut& qkv, cudaStream_t s) {
  const int64_t cols = OUT == Out::Plain ? N : N / 2, chunks = K / Vec<TI>::N;
  const bool wide = ops::InferenceGemv::kernel() == ops::InferenceGemv::Kernel::Wide;
  // Wide: a warp per column while the row is one round of 8 loads per lane, else 4 per column.
  const int wpc = wide && chunks > 32 * 8 ? 4 : 1;
  // Each launch a programmatic dependent of the kernel before (dependent_launch.cuh).
  auto go = [&](auto* kern, int per_column) {
    launch_dependent(kern, dim3(static_cast<unsigned>(ceil_div(cols, kWarps / per_column))), dim3(kWarps * 32), s, x,
                     gamma, eps, w, b, residual, y, static_cast<int>(M), N, K, qkv);
  };
  if (!wide)
    go(gemv_kernel<TI, TO, MR, NORM, OUT, 1, 4>, 1);
  else if (wpc == 1)
    go(gemv_kernel<TI, TO, MR, NORM, OUT, 1, 8>, 1);
  else
    go(gemv_kernel<TI, TO, MR, NORM, OUT, 4, 8>, 4);
}

template <typename TI, typename TO, int MR>
void launch(const TI* x, const TI* w, const TO* b, const TO* residual, TO* y, int64_t M, int64_t N, int64_t K,
            const GemvFusion& f, cudaStream_t s) {
  if (K % Vec<TI>::N == 0 && aligned16(x) && aligned16(w)) {
    const TI* gamma = static_cast<const TI*>(f.norm_weight);
    const GemvQkvOut none{};
    if constexpr (std::is_same_v<TI, TO> && MR <= 2) {  // the fusions: decode's 1-2 rows, one type
      const float e = f.eps;
      if (f.qkv && gamma) return launch_vec<TI, TO, MR, true, Out::Qkv>(x, gamma, e, w, b, residual, y, M, N, K, *f.qkv, s);
      if (f.qkv) return launch_vec<TI, TO, MR, false, Out::Qkv>(x, gamma, e, w, b, residual, y, M, N, K, *f.qkv, s);
      if (gamma && f.swiglu)
        return launch_vec<TI, TO, MR, true, Out::SwiGlu>(x, gamma, e, w, b, residual, y, M, N, K, none, s);
      if (gamma) return launch_vec<TI, TO, MR, true, Out::Plain>(x, gamma, e, w, b, residual, y, M, N, K, none, s);
      if (f.swiglu) return launch_vec<TI, TO, MR, false, Out::SwiGlu>(x, gamma, e, w, b, residual, y, M, N, K, none, s);
    }
    return launch_vec<TI, TO, MR, false, Out::Plain>(x, nullptr, 0.f, w, b, residual, y, M, N, K, none, s);
  }
  launch_dependent(gemv_scalar_kernel<TI, TO, MR>, dim3(static_cast<unsigned>(ceil_div(N, kWarps))), dim3(kWarps * 32), s,
                   x, w, b, residual, y, static_cast<int>(M), N, K);
}

}  // namespace

// The norm fusion recomputes rstd in the order of norms.cu's one-warp kernel, which rmsnorm_forward
// runs for rows of up to 32 x 16 vectors of 8 (K <= 4,096); longer rows take its block kernel,
// which sums in another order, so the fusion would no longer store the unfused bits (an H200 run
// of DecodeFusionsGpu found K = 8,192 one bf16 ulp off): those go to the composition (kNormMaxK).
bool gemv_fusable(const void* x, const void* w, const void* gamma, int64_t M, int64_t K) {
  return M >= 1 && M <= 2 && K % 8 == 0 && aligned16(x) && aligned16(w) &&
         (!gamma || (aligned16(gamma) && K <= kNormMaxK));
}

template <typename TI, typename TO>
void gemv_forward(const TI* x, const nd<TI>* w, const nd<TO>* b, const nd<TO>* residual, TO* y, int64_t M, int64_t N,
                  int64_t K, cudaStream_t s, const GemvFusion& f) {
  static_assert(!std::is_same_v<TI, float>, "the GEMV reads half-precision weights");
  MT_CHECK(M >= 0 && M <= kGemvMaxRows && N >= 0 && K >= 0, "gemv_forward: {} x {} x {} (at most {} rows)", M, N, K,
           kGemvMaxRows);
  MT_CHECK(N < (int64_t{1} << 31) * kWarps / 4, "gemv_forward: {} output columns exceed the grid", N);
  const bool fused = f.norm_weight || f.swiglu || f.qkv;
  MT_CHECK(!fused || (std::is_same_v<TI, TO> && gemv_fusable(x, w, f.norm_weight, M, K)),
           "gemv_forward: the fusions take 1-2 rows of one half type, K % 8 == 0, 16-byte aligned (got {} x {} x {})",
           M, N, K);
  MT_CHECK(!f.swiglu || (N % 2 == 0 && !residual), "gemv_forward: SwiGLU needs [gate; up] rows and no residual");
  MT_CHECK(!f.qkv || (!f.swiglu && !residual && f.qkv->D % 2 == 0 && N == int64_t{f.qkv->G} * (f.qkv->qpg + 2) * f.qkv->D),
           "gemv_forward: the QKV epilogue needs linear_qkv's {} x (qpg + 2) x {} rows, got {}, no SwiGLU or residual",
           f.qkv ? f.qkv->G : 0, f.qkv ? f.qkv->D : 0, N);
  if (M == 0 || N == 0) return;
  calls.fetch_add(1, std::memory_order_relaxed);
  // The smallest instantiation that holds M rows: its accumulators stay in registers.
  if (M == 1)
    launch<TI, TO, 1>(x, w, b, residual, y, M, N, K, f, s);
  else if (M == 2)
    launch<TI, TO, 2>(x, w, b, residual, y, M, N, K, f, s);
  else if (M <= 4)
    launch<TI, TO, 4>(x, w, b, residual, y, M, N, K, f, s);
  else if (M <= 8)
    launch<TI, TO, 8>(x, w, b, residual, y, M, N, K, f, s);
  else
    launch<TI, TO, 16>(x, w, b, residual, y, M, N, K, f, s);
}

int64_t gemv_calls() { return calls.load(std::memory_order_relaxed); }

MT_INSTANTIATE(gemv_forward, bf16, bf16);
MT_INSTANTIATE(gemv_forward, f16, f16);
MT_INSTANTIATE(gemv_forward, bf16, float);

}  // namespace mt::cuda
