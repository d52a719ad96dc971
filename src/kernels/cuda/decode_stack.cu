// The whole decoder stack of one decode step in one kernel (ops::decode_layer_stack, issue #22):
// batch 1, Llama-family layers (RMSNorm, grouped-query attention over the KV cache, SwiGLU).
//
// Why: at batch 1 a decode step is the weights streaming out of HBM once, and with a kernel per
// linear layer each of the 64 per-layer GEMVs of llama-1.5b lost 2-7 us at its boundary (the
// kernel before draining, the next one ramping up; `cuda_ops_bench --only=gemvchain`, session 17):
// ~0.29 ms of a 1.05 ms token, the bulk of the gap to the bandwidth bound. Here one block per SM
// stays resident for all layers and walks five phases per layer: QKV (norm, product, RoPE, k and
// v into the cache), attention, proj (+ residual), fc1 (norm, product, SwiGLU), fc2 (+ residual),
// with a grid-wide barrier between phases. Before each barrier every warp issues its first round
// of the next phase's weight loads into registers (the weights do not depend on the phase before;
// before the attention, its older keys and values go to L2), so the memory system stays busy
// across the boundary instead of draining: the boundary costs a barrier (~1 us), hidden behind
// loads that are already in flight.
//
// Measured (H200, session 18): not yet faster. 1.09-1.10 ms of GPU time per token against the
// layers' 0.96, so it is opt-in (MT_DECODE_STACK=1). The attention phase idles the DRAM for ~10 us
// a layer and 12 warps per SM keep too few rounds in flight for fc2; the phase timers
// (MT_DECODE_STACK_TIMES=1) and the next steps are in docs/decode_batch1_accounting.md.
//
// The same bits as the kernel-per-layer path (gemv.cu's Wide GEMV with the decode fusions,
// kv_cache.cu's grouped-query attention with its fused split merge): each output column is the
// same warp-shaped sum (gemv_warp.cuh: one warp per column for rows of up to 32 x 8 16-byte
// chunks, else 4 warps each a quarter, added in warp order), each attention split the same team
// of 4 warps (decode_attention.cuh), with the same splits. So greedy tokens do not depend on
// which path ran (DecodeStackGpu tests it). Data written during the kernel by other SMs (x, q,
// the caches' new rows, the attention output, SwiGLU's output) is read through L2 (__ldcg), never
// through L1, which is not coherent across SMs.
//
// The barrier needs every block resident at once: one block per SM (kThreads threads), launched
// cooperatively, which refuses a grid that cannot be co-resident. Its spin has a
// bound (a trap after ~10 s: an error, never a hang).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/gemv_warp.cuh"

namespace mt::cuda {
namespace {

using gemv::item_rows;
using gemv::kNormMaxK;
using gemv::load_round;
using gemv::Out;
using gemv::row_rstd;
using gemv::store_item;

// Attention teams per block: 3 gives 384 threads, one block per SM with up to 170 registers each
// (ptxas: 168 used, 0.6 KB of spill loads). With 4 (512 threads, 128 registers) the two-row GEMV
// phases with the norm spilled ~2 KB (docs/decode_batch1_accounting.md, session 18).
constexpr int kTeams = 3;
constexpr int kThreads = kTeams * kGqaWarps * 32;
constexpr int kBlockWarps = kThreads / 32;
constexpr int kU = 8;                                // loads in flight per lane and weight row (gemv.cu's Wide)
constexpr int kSplitWarps = 4;                       // warps per column past one round (gemv.cu's Wide)
constexpr int kQmax = 4;                             // query heads per group
constexpr long long kBarrierCycles = 1LL << 34;      // ~10 s at 1.7-2 GHz

std::atomic<int64_t> launches{0};

template <typename T>
struct StackLayer {
  const T* in_norm;
  const T* w_qkv;
  const T* b_qkv;
  const T* w_proj;
  const T* mlp_norm;
  const T* w_fc1;
  const T* b_fc1;
  const T* w_fc2;
  T* k_cache;
  T* v_cache;
  float in_eps, mlp_eps;
};

// Kernel parameters stay under 4 KB: longer stacks run as several launches.
constexpr int kMaxLayers = 32;

template <typename T>
struct StackArgs {
  StackLayer<T> layer[kMaxLayers];
  int layers;
  const T* x_in;  // the stack's input row (layer 0 reads it)
  T* x;           // the residual stream: written by layer 0's proj, then updated in place
  T* q;           // [Hq * D]
  T* attn;        // [Hq * D]
  T* h;           // [F]
  float* part;    // [Hq, splits, D + 2]
  int* arrivals;  // [G] the attention's last-split counters
  int* barrier;   // [2] the grid barrier's count and the exit count, 0 between launches
  const int32_t* slot;
  const int32_t* pos;
  const float* cos;
  const float* sin;  // [D / 2] or null (no RoPE)
  int64_t hidden, F, Hq, G, slots, L, per_split;  // the head dim is the kernel's template argument
  int splits;
  float scale;
  unsigned long long* times;  // or null: per barrier, the last block's arrival and block 0's leave (ns)
};

// The block's shared memory: this struct, then the phase's input row xs (x_elems(): the longest of
// hidden, Hq * D and F), normalised where the phase has a norm. Every phase reads its x from
// there. (Read through L2 per 16-byte chunk inside the product's loop instead, each round of a
// warp's loads waited for a chain of L2 round trips: proj and fc2 ran at 0.9-1.4 TB/s that way.)
template <typename T, int D>
struct StackShared {
  __align__(16) T xraw[kNormMaxK];  // x as read, for the norm
  float red[kBlockWarps][2];        // the split columns' per-warp sums
  GqaShared<kQmax, D> team[kTeams];
};
template <typename T, int D>
__device__ __forceinline__ T* stage_row(StackShared<T, D>& sm) {
  return reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(&sm) + sizeof(StackShared<T, D>));
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Every block's writes before it are visible to every block after it. With `times`, barrier b
// records when the last block arrived (times[2b]) and when block 0 left (times[2b + 1]), in the
// device's global nanoseconds (later launches overwrite earlier ones: the clock only grows).
struct GridBarrier {
  int* count;
  unsigned long long* times;
  int target = 0;
  __device__ void sync(int b) {
    target += static_cast<int>(gridDim.x);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (times) atomicMax(times + 2 * b, global_ns());
      __threadfence();
      atomicAdd(count, 1);
      const long long t0 = clock64();
      while (load_acquire(count) < target)
        if (clock64() - t0 > kBarrierCycles) __trap();  // a block never arrived: fail, do not hang
      __threadfence();
      if (times && blockIdx.x == 0) times[2 * b + 1] = global_ns();
    }
    __syncthreads();
  }
};

struct TeamSync {  // a named barrier per attention team (0 is __syncthreads')
  int team;
  __device__ void operator()() const {
    asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "r"(kGqaWarps * 32) : "memory");
  }
};

// One linear layer of a phase: y (or the QKV epilogue's targets) from x [K] and w [N, K].
template <typename T>
struct GemvOp {
  const T* w;
  const T* b;
  int64_t N, K;
  const T* x;      // staged into the block's shared memory (stage_x), normalised where gamma is set
  const T* gamma;  // RMSNorm's scale
  float eps;
  const T* residual;
  T* y;
  GemvQkvOut qkv;
};

// The first work item of this warp and the stride between its items: one warp per item (WPC 1),
// or kSplitWarps warps of one block per item, the block's items in lockstep.
template <int WPC>
__device__ __forceinline__ int64_t first_item(int warp) {
  return WPC == 1 ? static_cast<int64_t>(blockIdx.x) * kBlockWarps + warp
                  : static_cast<int64_t>(blockIdx.x) * (kBlockWarps / WPC) + warp / WPC;
}
template <int WPC>
__device__ __forceinline__ int64_t item_stride() {
  return static_cast<int64_t>(gridDim.x) * (kBlockWarps / WPC);
}

template <typename T, Out OUT, int R>
__device__ __forceinline__ void item_weights(const GemvOp<T>& op, int64_t n, bool live, int64_t (&col)[R],
                                             const T* (&wr)[R]) {
  item_rows<OUT, R>(n, op.N / R, op.qkv, col);
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = op.w + (live ? col[r] : 0) * op.K;
}

// Before the barrier: this warp's first round of its first item's weights into registers.
template <typename T, Out OUT, int R, int WPC>
__device__ __forceinline__ void preload_wpc(uint4 (&raw)[2][kU], const GemvOp<T>& op, int warp, int lane) {
  const int64_t n = first_item<WPC>(warp);
  const bool live = n < op.N / R;
  int64_t col[R];
  const T* wr[R];
  item_weights<T, OUT, R>(op, n, live, col, wr);
  load_round<T, R>(raw, wr, static_cast<int64_t>(warp % WPC) * 32 * kU, op.K / Vec<T>::N, live, lane);
}

template <typename T>
__device__ __forceinline__ bool split_columns(const GemvOp<T>& op) {  // gemv.cu's Wide rule
  return op.K / Vec<T>::N > 32 * kU;
}

template <typename T, Out OUT, int R>
__device__ __forceinline__ void preload(uint4 (&raw)[2][kU], const GemvOp<T>& op, int warp, int lane) {
  if (split_columns(op))
    preload_wpc<T, OUT, R, kSplitWarps>(raw, op, warp, lane);
  else
    preload_wpc<T, OUT, R, 1>(raw, op, warp, lane);
}

// x [K] into the block's row, normalised where NORM as gemv.cu's norm fusion (and rmsnorm_forward)
// computes it.
template <typename T, bool NORM, int D>
__device__ __forceinline__ void stage_x(const GemvOp<T>& op, StackShared<T, D>& sm, int lane) {
  constexpr int V = Vec<T>::N;
  const int64_t nv = op.K / V;
  T* xs = stage_row(sm);
  T* dst = NORM ? sm.xraw : xs;
  for (int64_t vi = threadIdx.x; vi < nv; vi += kThreads)
    *reinterpret_cast<uint4*>(dst + vi * V) = __ldcg(reinterpret_cast<const uint4*>(op.x + vi * V));
  __syncthreads();
  if constexpr (!NORM) return;
  const float rs = row_rstd(sm.xraw, op.K, op.eps, lane);
  for (int64_t vi = threadIdx.x; vi < nv; vi += kThreads) {
    float xv[V], gv[V];
    Vec<T>::load(sm.xraw + vi * V, xv);
    Vec<T>::load(op.gamma + vi * V, gv);
#pragma unroll
    for (int e = 0; e < V; ++e) xv[e] = (xv[e] * rs) * gv[e];
    Vec<T>::store(xs + vi * V, xv);
  }
  __syncthreads();
}

// A work item's outputs (gemv_warp.cuh's store_item). Plain phases take columns in pairs (n,
// n + N/2): two rows' loads in flight per warp, as SwiGLU's and QKV's, each column summed exactly
// as alone (the same fmaf chain, the same butterfly), stored on its own.
template <typename T, Out OUT, int R>
__device__ __forceinline__ void store_columns(const float (&sum)[R][1], int64_t n, const int64_t (&col)[R],
                                              const GemvOp<T>& op, int lane) {
  if constexpr (OUT == Out::Plain) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float one[1][1] = {{sum[r][0]}};
      store_item<T, 1, Out::Plain, 1>(one, col[r], col[r], op.N, op.N, op.b, op.residual, op.y, op.qkv, 1, lane);
    }
  } else {
    store_item<T, 1, OUT, R>(sum, n, col[0], op.N / R, op.N, op.b, op.residual, op.y, op.qkv, 1, lane);
  }
}

// A phase's GEMV (gemv.cu's gemv_kernel for one row, item by item), its first round in raw.
template <typename T, Out OUT, int R, int WPC, int D>
__device__ __forceinline__ void gemv_phase_wpc(uint4 (&raw)[2][kU], const GemvOp<T>& op, StackShared<T, D>& sm,
                                               int warp, int lane) {
  constexpr int V = Vec<T>::N;
  constexpr bool kNorm = OUT != Out::Plain;  // the QKV and fc1 phases read RMSNorm's output
  stage_x<T, kNorm>(op, sm, lane);
  const T* x = stage_row(sm);
  const int64_t cols = op.N / R, chunks = op.K / V, step = static_cast<int64_t>(WPC) * 32 * kU;
  const int part = warp % WPC;
  const int64_t n0 = first_item<WPC>(warp), stride = item_stride<WPC>();
  for (int64_t n = n0;; n += stride) {
    if (n - (WPC == 1 ? 0 : warp / WPC) >= cols) break;  // WPC > 1: the block's items end together
    const bool live = n < cols;
    int64_t col[R];
    const T* wr[R];
    item_weights<T, OUT, R>(op, n, live, col, wr);
    int64_t c0 = static_cast<int64_t>(part) * 32 * kU;
    if (n != n0) load_round<T, R>(raw, wr, c0, chunks, live, lane);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    while (c0 < chunks) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = c0 + u * 32 + lane;
        if (c >= chunks) break;
        float wf[R][V], xv[V];
#pragma unroll
        for (int r = 0; r < R; ++r) Vec<T>::unpack(raw[r][u], wf[r]);
        Vec<T>::load(x + c * V, xv);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r] = fmaf(wf[r][e], xv[e], acc[r]);
      }
      c0 += step;
      if (c0 < chunks) load_round<T, R>(raw, wr, c0, chunks, live, lane);
    }
    float sum[R][1];
#pragma unroll
    for (int r = 0; r < R; ++r) sum[r][0] = warp_sum(acc[r]);
    if constexpr (WPC > 1) {  // the column's warps' shares, added in warp order
      if (lane == 0)
#pragma unroll
        for (int r = 0; r < R; ++r) sm.red[warp][r] = sum[r][0];
      __syncthreads();
      if (part == 0 && live) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float s = sm.red[warp][r];
#pragma unroll
          for (int j = 1; j < WPC; ++j) s += sm.red[warp + j][r];
          sum[r][0] = s;
        }
        store_columns<T, OUT, R>(sum, n, col, op, lane);
      }
      __syncthreads();
    } else if (live) {
      store_columns<T, OUT, R>(sum, n, col, op, lane);
    }
  }
}

template <typename T, Out OUT, int R, int D>
__device__ __forceinline__ void gemv_phase(uint4 (&raw)[2][kU], const GemvOp<T>& op, StackShared<T, D>& sm, int warp,
                                           int lane) {
  if (split_columns(op))
    gemv_phase_wpc<T, OUT, R, kSplitWarps>(raw, op, sm, warp, lane);
  else
    gemv_phase_wpc<T, OUT, R, 1>(raw, op, sm, warp, lane);
}

// The attention's (group, split) items, a team each in turn.
template <typename T, int LPK, bool PREFETCH>
__device__ __forceinline__ void attention_items(const GqaArgs<T>& a, StackShared<T, LPK * 8>& sm) {
  const int team = static_cast<int>(threadIdx.x) / (kGqaWarps * 32), tid = static_cast<int>(threadIdx.x) % (kGqaWarps * 32);
  const int64_t items = a.G * a.splits;
  // Team-major: the first gridDim.x items on different SMs.
  for (int64_t it = static_cast<int64_t>(team) * gridDim.x + blockIdx.x; it < items;
       it += static_cast<int64_t>(gridDim.x) * kTeams) {
    const int64_t g = it / a.splits;
    const int split = static_cast<int>(it % a.splits);
    if constexpr (PREFETCH) {
      gqa_prefetch<T, LPK>(a, 0, g, split, tid);
    } else {
      gqa_attend<T, LPK, kQmax>(a, 0, g, split, tid, sm.team[team], TeamSync{team});
      TeamSync{team}();  // the team's shared memory is free for its next item
    }
  }
}

template <typename T, int LPK>
__global__ void __launch_bounds__(kThreads, 1) decode_stack_kernel(const __grid_constant__ StackArgs<T> a) {
  constexpr int D = LPK * 8;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& sm = *reinterpret_cast<StackShared<T, D>*>(smem);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  GridBarrier bar{a.barrier, a.times};
  if (a.times && blockIdx.x == 0 && threadIdx.x == 0) a.times[1] = global_ns();  // "barrier" 0: the start
  const int64_t qpg = a.Hq / a.G;
  auto qkv_op = [&](int l, const T* x) {
    const StackLayer<T>& L = a.layer[l];
    const GemvQkvOut o{a.q,   L.k_cache,          L.v_cache,          a.slot,     a.pos, a.cos, a.sin,
                       static_cast<int>(a.G), static_cast<int>(qpg), static_cast<int>(D), a.slots, a.L};
    return GemvOp<T>{L.w_qkv, L.b_qkv, a.G * (qpg + 2) * D, a.hidden, x, L.in_norm, L.in_eps, nullptr, nullptr, o};
  };
  uint4 raw[2][kU];
  preload<T, Out::Qkv, 2>(raw, qkv_op(0, a.x_in), warp, lane);
  for (int l = 0; l < a.layers; ++l) {
    const StackLayer<T>& L = a.layer[l];
    const T* xin = l == 0 ? a.x_in : a.x;
    const int b = 5 * l;  // this layer's barriers: b (before QKV; none in layer 0) to b + 4
    if (l > 0) bar.sync(b);
    gemv_phase<T, Out::Qkv, 2>(raw, qkv_op(l, xin), sm, warp, lane);

    const GqaArgs<T> ga{a.q, L.k_cache, L.v_cache, a.slot, a.pos, a.attn, a.part, 1, a.Hq, a.G, a.L, a.slots,
                        a.splits, a.per_split, a.scale, a.arrivals};
    const GemvOp<T> proj{L.w_proj, nullptr, a.hidden, a.Hq * D, a.attn, nullptr, 0.f, xin, a.x, {}};
    attention_items<T, LPK, true>(ga, sm);
    bar.sync(b + 1);
    attention_items<T, LPK, false>(ga, sm);

    preload<T, Out::Plain, 2>(raw, proj, warp, lane);
    bar.sync(b + 2);
    gemv_phase<T, Out::Plain, 2>(raw, proj, sm, warp, lane);

    const GemvOp<T> fc1{L.w_fc1, L.b_fc1, 2 * a.F, a.hidden, a.x, L.mlp_norm, L.mlp_eps, nullptr, a.h, {}};
    preload<T, Out::SwiGlu, 2>(raw, fc1, warp, lane);
    bar.sync(b + 3);
    gemv_phase<T, Out::SwiGlu, 2>(raw, fc1, sm, warp, lane);

    const GemvOp<T> fc2{L.w_fc2, nullptr, a.hidden, a.F, a.h, nullptr, 0.f, a.x, a.x, {}};
    preload<T, Out::Plain, 2>(raw, fc2, warp, lane);
    bar.sync(b + 4);
    if (l + 1 == a.layers) allow_dependent_launch();  // the output layer may start its weight loads
    gemv_phase<T, Out::Plain, 2>(raw, fc2, sm, warp, lane);
    if (l + 1 < a.layers) {
      preload<T, Out::Qkv, 2>(raw, qkv_op(l + 1, a.x), warp, lane);
    }
  }
  // Every block is past its last barrier once it counts itself out: the last one out zeroes both
  // counters for the next launch.
  __syncthreads();
  if (a.times && threadIdx.x == 0) atomicMax(a.times + 10 * a.layers, global_ns());  // the last block's end
  if (threadIdx.x == 0 && atomicAdd(a.barrier + 1, 1) == static_cast<int>(gridDim.x) - 1) {
    a.barrier[0] = 0;
    a.barrier[1] = 0;
    __threadfence();
  }
}

int64_t x_elems(const DecodeStack& s) { return std::max({s.hidden, s.F, s.Hq * s.D}); }

// Resident blocks per SM for the kernel with this shared memory (0: it cannot run).
template <typename T, int LPK>
int blocks_per_sm(size_t smem) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(decode_stack_kernel<T, LPK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
  int b = 0;
  MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, decode_stack_kernel<T, LPK>, kThreads, smem));
  return b;
}

// The phase timers' buffer where MT_DECODE_STACK_TIMES=1 (issue #22's A/B runs; read by
// decode_stack_phase_ns), else null. Read once per process.
constexpr int kTimeSlots = 2 * (5 * kMaxLayers + 1);

unsigned long long* phase_times() {
  static unsigned long long* const t = []() -> unsigned long long* {
    const char* tm = std::getenv("MT_DECODE_STACK_TIMES");
    if (!tm || std::strcmp(tm, "1") != 0) return nullptr;
    unsigned long long* p = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&p, kTimeSlots * sizeof(unsigned long long)));
    MT_CUDA_CHECK(cudaMemset(p, 0, kTimeSlots * sizeof(unsigned long long)));
    return p;
  }();
  return t;
}

template <typename T, int LPK>
bool launch_stack(const DecodeStack& s, cudaStream_t st) {
  const size_t smem = sizeof(StackShared<T, LPK * 8>) + x_elems(s) * sizeof(T);
  if (blocks_per_sm<T, LPK>(smem) < 1) return false;
  int* counters = arrival_counters(ArrivalUser::DecodeStack, s.G + 2, st);
  if (!counters) return false;
  StackArgs<T> a{};
  a.x = static_cast<T*>(s.x);
  a.q = static_cast<T*>(s.q);
  a.attn = static_cast<T*>(s.attn);
  a.h = static_cast<T*>(s.h);
  a.part = s.part;
  a.arrivals = counters;
  a.barrier = counters + s.G;
  a.slot = s.slot;
  a.pos = s.pos;
  a.cos = s.cos;
  a.sin = s.sin;
  a.hidden = s.hidden, a.F = s.F, a.Hq = s.Hq, a.G = s.G, a.slots = s.slots, a.L = s.L;
  a.splits = s.splits;
  a.per_split = s.per_split;
  a.scale = s.scale;
  a.times = phase_times();
  const int64_t layers = static_cast<int64_t>(s.layers.size());
  for (int64_t l0 = 0; l0 < layers; l0 += kMaxLayers) {
    a.layers = static_cast<int>(std::min<int64_t>(kMaxLayers, layers - l0));
    a.x_in = l0 == 0 ? static_cast<const T*>(s.x_in) : a.x;
    for (int l = 0; l < a.layers; ++l) {
      const DecodeStackLayer& L = s.layers[static_cast<size_t>(l0 + l)];
      a.layer[l] = {static_cast<const T*>(L.in_norm), static_cast<const T*>(L.w_qkv), static_cast<const T*>(L.b_qkv),
                    static_cast<const T*>(L.w_proj),  static_cast<const T*>(L.mlp_norm), static_cast<const T*>(L.w_fc1),
                    static_cast<const T*>(L.b_fc1),   static_cast<const T*>(L.w_fc2),   static_cast<T*>(L.k_cache),
                    static_cast<T*>(L.v_cache),       L.in_eps,                          L.mlp_eps};
    }
    launch_cooperative(decode_stack_kernel<T, LPK>, dim3(static_cast<unsigned>(sm_count())), dim3(kThreads), smem, st,
                       a);
    launches.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

}  // namespace

bool decode_stack_applies(const DecodeStack& s) {
  const int64_t V = 8;  // elements per 16-byte chunk, both half types
  const bool shapes = (s.D == 64 || s.D == 128) && s.G >= 1 && s.Hq % s.G == 0 && s.Hq / s.G <= kQmax &&
                      s.hidden % V == 0 && s.hidden <= kNormMaxK && s.F % V == 0 && (s.Hq * s.D) % V == 0 &&
                      !s.layers.empty() && s.G + 2 <= 1 << 16 && x_elems(s) <= 64 * 1024;
  if (!shapes || !aligned16(s.x_in) || !aligned16(s.x) || !aligned16(s.q) || !aligned16(s.attn) || !aligned16(s.h))
    return false;
  for (const DecodeStackLayer& L : s.layers)
    for (const void* p : {L.in_norm, L.w_qkv, L.w_proj, L.mlp_norm, L.w_fc1, L.w_fc2, static_cast<const void*>(L.k_cache),
                          static_cast<const void*>(L.v_cache)})
      if (!p || !aligned16(p)) return false;
  return true;
}

int decode_stack_splits(int64_t G, int64_t L, int64_t D) { return gqa_splits(G, L, D, sm_count()); }

template <typename T>
bool decode_stack_forward(const DecodeStack& s, cudaStream_t st) {
  if (!decode_stack_applies(s)) return false;
  return s.D == 64 ? launch_stack<T, 8>(s, st) : launch_stack<T, 16>(s, st);
}

int64_t decode_stack_launches() { return launches.load(std::memory_order_relaxed); }

std::vector<double> decode_stack_phase_ns(int layers) {
  unsigned long long* times = phase_times();
  if (!times || layers < 1 || layers > kMaxLayers) return {};
  std::vector<unsigned long long> t(kTimeSlots);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  MT_CUDA_CHECK(cudaMemcpy(t.data(), times, t.size() * sizeof(t[0]), cudaMemcpyDeviceToHost));
  // Phase k of layer l runs from barrier 5l + k's leave (layer 0's QKV: the start) to the next
  // barrier's last arrival (the last layer's fc2: the end); barrier b from its last arrival to its leave.
  std::vector<double> out(10, 0.0);
  auto arrive = [&](int b) { return static_cast<double>(t[2 * b]); };
  auto leave = [&](int b) { return static_cast<double>(t[2 * b + 1]); };
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 5; ++k) {
      const int b = 5 * l + k;
      out[k] += arrive(b + 1) - leave(b);
      if (b > 0) out[5 + k] += leave(b) - arrive(b);
    }
  return out;
}

MT_INSTANTIATE_HALF(decode_stack_forward);

}  // namespace mt::cuda
