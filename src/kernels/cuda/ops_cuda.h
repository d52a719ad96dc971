#pragma once
// The CUDA launchers: the GPU counterparts of the CPU reference ops (kernels/cpu/ops.h), on
// device pointers, one template per op (see "The launchers" below). The Tensor ops of ops.def
// call them from kernels/cuda/tensor_ops.cpp and its neighbours; tests and benchmarks directly.
// Conventions (in addition to ops.h's):
//  * Storage is bf16 or fp16 (the --bf16 / --fp16 training paths) or fp32 (where cheap; the
//    tests use it to compare with the CPU tightly). Arithmetic is fp32 everywhere; row
//    statistics (rstd, mean, lse) are fp32.
//  * Every call is asynchronous on the given stream; nothing synchronises the host unless the
//    function says so. Temporary scratch comes from the device's default stream-ordered pool
//    (cudaMallocAsync on the same stream), which CudaAllocator also draws from.
//  * Backward functions WRITE input gradients and ACCUMULATE (+=) parameter gradients into fp32
//    main-grad buffers, whatever the storage type of the activations.
//  * Deterministic: no floating-point atomics; every reduction has a fixed shape and order, so
//    the same inputs give bit-identical outputs run to run (on the same GPU model).
//  * Errors (CUDA or cuBLAS failures, unsupported shapes) throw mt::Error.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "kernels/attention_shape.h"

namespace mt::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;  // IEEE half: the --fp16 storage type, instantiated wherever bf16 is

// Throws mt::Error naming the failed call when e != cudaSuccess.
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define MT_CUDA_CHECK(expr) ::mt::cuda::check_cuda((expr), #expr, __FILE__, __LINE__)

// ---- Device memory. Stream-ordered allocations from the device's default memory pool, with a
// release threshold so freed blocks stay cached in the pool instead of going back to the driver
// at every synchronisation. All allocations and frees are ordered on `stream` (the compute
// stream); memory freed there is reused by later work on that stream without a sync.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device = 0, cudaStream_t stream = nullptr, uint64_t release_threshold = UINT64_MAX);
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return Device::CUDA; }

  void set_stream(cudaStream_t s) { stream_ = s; }
  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_; }
  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  // The peak of tensors plus kernel scratch (mt::cuda::Scratch: GEMM, cuDNN and sort workspaces).
  size_t peak_with_scratch_bytes() const { return peak_all_; }
  void reset_peak() { peak_ = in_use_; peak_all_ = in_use_ + scratch_; }
  void note_scratch(int64_t delta);
  // Fails naming the request (`what`: "" for a tensor) and what the pool holds: the one
  // out-of-memory message for tensors and kernel workspaces.
  [[noreturn]] void out_of_memory(cudaError_t e, size_t bytes, const char* what) const;
  // Returns cached, unused pool memory to the driver, keeping at most `keep_bytes`.
  void trim(size_t keep_bytes = 0);

  // Graph capture without memory nodes (ops::DeviceArena, kernels/device.h). Allocations made
  // during a stream capture become the graph's memory alloc/free nodes; a decode step's ~200 small
  // tensors put hundreds of them between its kernels. While a tally runs, every request's size
  // (rounded as the arena rounds) is summed; while an arena serves, requests are bump-allocated
  // from it (requests that do not fit go to the pool and are counted), and frees of its memory
  // are no-ops until the arena is released.
  static size_t arena_round(size_t bytes) { return (bytes + 255) / 256 * 256; }
  void begin_tally();
  size_t end_tally();
  void serve_from(char* base, size_t bytes);  // base null: serve from the pool again
  size_t arena_used() const { return arena_used_; }
  size_t arena_misses() const { return arena_misses_; }
  void release_arena(const char* base);  // its memory is about to be freed: forget its range

 private:
  bool owned_by_arena(const void* p) const;
  int device_;
  cudaStream_t stream_;
  cudaMemPool_t pool_ = nullptr;
  size_t in_use_ = 0, peak_ = 0;
  size_t scratch_ = 0, peak_all_ = 0;
  bool tallying_ = false;
  size_t tally_ = 0;
  char* arena_ = nullptr;  // the arena serving now
  size_t arena_size_ = 0, arena_used_ = 0, arena_misses_ = 0;
  std::vector<std::pair<const char*, const char*>> arena_ranges_;  // every live arena's [begin, end)
};

// Creates (once) a CudaAllocator for `device` on `stream`, registers it with core so Device::CUDA
// tensors use it (register_cuda_allocator), and registers core's device copy hook (synchronous
// for the host) and zero hook (stream-ordered on `stream`). Later calls return the same one.
CudaAllocator* install_cuda_allocator(int device = 0, cudaStream_t stream = nullptr);

// ---- GEMM through cuBLASLt. A Gemm owns the cuBLASLt handle, one workspace, and a cache of
// matmul descriptors and heuristic choices per (shape, types, alignment, epilogue). Use one Gemm
// per stream at a time (the workspace is shared by its calls).
// Autotuning (gemm.cu): the first call of each shape times the heuristic's candidates on its
// inputs (synchronising the stream once) and keeps the fastest whose output is bit-identical to
// the heuristic default's, so results do not depend on tuning. On unless MT_GEMM_TUNE=0.
class Gemm {
 public:
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // Overrides MT_GEMM_TUNE for this Gemm (tests and benchmarks compare both). Off: every call
  // runs the heuristic default. Shapes tuned while it was on keep their choice for when it is on.
  void set_tuning(bool on);
  bool tuning() const;
  // Shapes whose candidates have been timed so far.
  int tuned_shapes() const;
  // Plans made so far (one per shape, row counts bucketed: gemm.cu's row_bucket).
  int plans() const;
  struct Impl;
  Impl* impl() { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- The launchers. Each op is one template, written once here and explicitly instantiated in
// its .cu file for the storage types listed with it ("storage": bf16, f16 and float; "half": bf16
// and f16). The types are deduced from the first pointer (and the output, where it may differ);
// the other pointers are not deduced (nd<T>), so that nullptr and DeviceBuffers pass for them.
template <typename T>
struct NonDeduced {
  using type = T;
};
template <typename T>
using nd = typename NonDeduced<T>::type;

// y[M,N] = x[M,K] @ w[N,K]^T (+ b[N]) (bias through the cuBLASLt epilogue). bf16 inputs with
// fp32 accumulation; output bf16 (bias bf16) or fp32 (bias fp32); or all fp32 (no TF32).
// (TI, TO): (bf16, bf16), (f16, f16), (bf16, float), (float, float).
template <typename TI, typename TO>
void linear_forward(Gemm& g, const TI* x, const nd<TI>* w, const nd<TO>* b, TO* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s);
// y[M,N] = x @ w^T (+ b) + residual[M,N] in one GEMM, the residual add in cuBLASLt's epilogue
// (C = residual with beta = 1, D = y): no separate add kernel, and one rounding to y's type of the
// fp32 sum (the order of the bias and residual adds within it is cuBLASLt's, gemm.cu). residual
// has y's type and layout and is only read; it may be y itself (accumulates into y).
// (TI, TO) as linear_forward.
template <typename TI, typename TO>
void linear_forward_residual(Gemm& g, const TI* x, const nd<TI>* w, const nd<TO>* b, const nd<TO>* residual, TO* y,
                             int64_t M, int64_t N, int64_t K, cudaStream_t s);
// The same product for at most kGemvMaxRows rows of x, bandwidth-bound (gemv.cu says why): y =
// x w^T (+ b) (+ residual, y's type and layout, only read; may be y), fp32 accumulation, one
// rounding to y's type. gemm.cu's linear_forward(_residual) calls it in inference (InferenceGemv,
// kernels/device.h) for these row counts. (TI, TO): (bf16, bf16), (f16, f16), (bf16, float).
constexpr int64_t kGemvMaxRows = 16;
// Inference picks the GEMV over cuBLASLt for at most this many rows. Measured on an H200
// (session 13, GpuGemv.DecodeShapesAgainstCublasLt, llama-1.5b's decode shapes): at 1-2 rows
// the GEMV streams the QKV, proj and fc1 weights at 1.1-1.8x cuBLASLt's rate; from 4 rows on,
// cuBLASLt is faster everywhere (at 16 rows by 2-4x).
constexpr int64_t kGemvChosenMaxRows = 2;
// ops::fused_qkv_forward's epilogue in the GEMV: where the packed QKV columns go instead of y.
// q [1, G*qpg, M, D] and the caches [slots, G, L, D] in y's type; row m to (slot[m], pos[m]);
// RoPE over whole heads with fp32 tables [M, D/2] (cos and sin null: none).
struct GemvQkvOut {
  void* q = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int G = 0, qpg = 0, D = 0;
  int64_t slots = 0, L = 0;
};
// The decode fusions of ops::fused_linear_forward inside the GEMV (gemv.cu): x read as
// rmsnorm(x; norm_weight, eps) (x's type) where norm_weight is set; with swiglu, w's N rows are
// [gate; up] and y [M, N/2] is swiglu of the product (no residual); with qkv, w's N rows are
// linear_qkv's (N = G*(qpg+2)*D) and the output goes where *qkv says (y unused, no residual).
// Only where gemv_fusable.
struct GemvFusion {
  const void* norm_weight = nullptr;
  float eps = 0.f;
  bool swiglu = false;
  const GemvQkvOut* qkv = nullptr;
};
template <typename TI, typename TO>
void gemv_forward(const TI* x, const nd<TI>* w, const nd<TO>* b, const nd<TO>* residual, TO* y, int64_t M, int64_t N,
                  int64_t K, cudaStream_t s, const GemvFusion& f = {});
// Whether gemv_forward takes the fusions for these operands: 1-2 rows, K % 8 == 0, 16-byte
// aligned x, w and norm weight (and TI == TO, the caller's to see).
bool gemv_fusable(const void* x, const void* w, const void* norm_weight, int64_t M, int64_t K);
// The one choice between the GEMV and cuBLASLt for a forward linear of M rows (gemm.cu): the GEMV
// while inference asks for it (InferenceGemv: decode steps) and M <= kGemvChosenMaxRows.
bool gemv_applies(int64_t M);
// gemv_forward calls so far in this process (tests: which kernel a linear layer chose).
int64_t gemv_calls();
// ops::decode_layer_stack's kernel (decode_stack.cu): one decode step of batch 1 through every
// layer of a Llama-family stack (RMSNorm, grouped-query attention over the KV cache with RoPE,
// SwiGLU, no biases but QKV's and fc1's) in one kernel, the same bits as the kernel-per-layer
// path (gemv_forward's fusions, cached_attention's decode kernel). Pointers of the model's half
// type; q, attn, h and part are the caller's scratch.
struct DecodeStackLayer {
  const void* in_norm = nullptr;  // RMSNorm scales [hidden]
  const void* w_qkv = nullptr;    // [G * (qpg + 2) * D, hidden]
  const void* b_qkv = nullptr;    // or null
  const void* w_proj = nullptr;   // [hidden, Hq * D]
  const void* mlp_norm = nullptr;
  const void* w_fc1 = nullptr;  // [2F, hidden]: gate, then up
  const void* b_fc1 = nullptr;  // or null
  const void* w_fc2 = nullptr;  // [hidden, F]
  void* k_cache = nullptr;
  void* v_cache = nullptr;  // [slots, G, L, D]
  float in_eps = 0.f, mlp_eps = 0.f;
};
struct DecodeStack {
  std::vector<DecodeStackLayer> layers;
  const void* x_in = nullptr;  // [hidden], the first layer's input
  void* x = nullptr;           // [hidden], the last layer's output (may be x_in)
  void* q = nullptr;           // [Hq * D]
  void* attn = nullptr;        // [Hq * D]
  void* h = nullptr;           // [F]
  float* part = nullptr;       // [Hq * splits * (D + 2)] where splits > 1
  const int32_t* slot = nullptr;
  const int32_t* pos = nullptr;  // [1]
  const float* cos = nullptr;
  const float* sin = nullptr;  // [D / 2] RoPE tables, or null
  int64_t hidden = 0, F = 0, Hq = 0, G = 0, D = 0, slots = 0, L = 0;
  int splits = 1;               // decode_stack_splits
  int64_t per_split = 0;
  float scale = 0.f;
};
// Whether the kernel takes this stack (head dim 64 or 128, at most 4 query heads per group,
// hidden <= 4,096, 16-byte aligned data); decode_stack_forward returns false where it does not
// (or where the GPU cannot hold its blocks at once), and the caller runs the layers one by one.
bool decode_stack_applies(const DecodeStack& s);
// The attention's key splits for a stack's cache length L (as cached_attention's decode kernel).
int decode_stack_splits(int64_t G, int64_t L, int64_t D);
template <typename T>
bool decode_stack_forward(const DecodeStack& s, cudaStream_t st);
// decode_stack_forward's kernel launches so far in this process (tests: that the kernel ran).
int64_t decode_stack_launches();
// With MT_DECODE_STACK_TIMES=1 (benches): the last launch's nanoseconds summed over its `layers`
// layers, per phase (QKV, attention, proj, fc1, fc2: from the barrier's leave to the next one's
// last arrival), then per barrier before each (the grid's wait); empty otherwise. Synchronises.
std::vector<double> decode_stack_phase_ns(int layers);
// dx[M,K] = dy @ w (written, if dx); dw[N,K] += dy^T @ x in fp32 (GEMM with beta = 1, if dw; with
// !accumulate_dw, beta = 0: dw is written, as a step's first gradient is, with nothing read);
// db[N] += column sums of dy (if db, deterministic). Storage types.
template <typename T>
void linear_backward(Gemm& g, const T* dy, const nd<T>* x, const nd<T>* w, nd<T>* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K, cudaStream_t s, bool accumulate_dw = true);

// ---- Embedding. out[n, dim] = table[ids[n], :]; dtable[ids[n], :] += dout[n, :] (fp32).
// The backward sorts positions by id (stable radix sort) and each distinct id's rows are summed
// by one block in increasing n: deterministic, no atomics. Storage types.
template <typename T>
void embedding_forward(const int32_t* ids, const T* table, nd<T>* out, int64_t n, int64_t dim, cudaStream_t s);
template <typename T>
void embedding_backward(const int32_t* ids, const T* dout, float* dtable, int64_t n, int64_t dim, cudaStream_t s);

// ---- RMSNorm / LayerNorm, one block per row (forward) and per fixed chunk of rows (backward,
// whose dw/db partial sums per chunk are added in chunk order). rstd/mean are fp32 [rows].
// The add_* forms fuse a residual add: sum = x + residual (rounded to the storage type and
// written, it is the next residual stream), y = norm(sum). In backward, `dx_add` (optional) is
// a gradient added to dx (the residual branch's gradient), so dx = norm_backward(dy) + dx_add.
// Storage types.
// amax (f32 [1], may be null): set to max |y| as stored (the FP8 producer fusion, ops.def).
template <typename T>
void rmsnorm_forward(const T* x, const nd<T>* w, nd<T>* y, float* rstd, int64_t rows, int64_t dim, float eps,
                     cudaStream_t s, float* amax = nullptr);
template <typename T>
void add_rmsnorm_forward(const T* x, const nd<T>* residual, nd<T>* sum, const nd<T>* w, nd<T>* y, float* rstd,
                         int64_t rows, int64_t dim, float eps, cudaStream_t s, float* amax = nullptr);
template <typename T>
void rmsnorm_backward(const T* dy, const nd<T>* x, const nd<T>* w, const float* rstd, nd<T>* dx, float* dw,
                      int64_t rows, int64_t dim, cudaStream_t s, const nd<T>* dx_add = nullptr);
template <typename T>
void layernorm_forward(const T* x, const nd<T>* w, const nd<T>* b, nd<T>* y, float* mean, float* rstd, int64_t rows,
                       int64_t dim, float eps, cudaStream_t s);
template <typename T>
void add_layernorm_forward(const T* x, const nd<T>* residual, nd<T>* sum, const nd<T>* w, const nd<T>* b, nd<T>* y,
                           float* mean, float* rstd, int64_t rows, int64_t dim, float eps, cudaStream_t s);
template <typename T>
void layernorm_backward(const T* dy, const nd<T>* x, const nd<T>* w, const float* mean, const float* rstd, nd<T>* dx,
                        float* dw, float* db, int64_t rows, int64_t dim, cudaStream_t s, const nd<T>* dx_add = nullptr);

// ---- RoPE, rotate-half, on x[B, H, S, D] in place over the first rot_dim channels.
// cos/sin: fp32 [S, rot_dim/2] device tables; rope_tables fills them on the device (angles in
// double, as the CPU). Storage types.
void rope_tables(int64_t seq, int64_t rot_dim, double base, float* cos_out, float* sin_out, cudaStream_t s);
template <typename T>
void rope_forward(T* x, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot_dim,
                  cudaStream_t s);
template <typename T>
void rope_backward(T* dx, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                   int64_t rot_dim, cudaStream_t s);

// ---- Flash attention (causal or not, GQA, dropout), q [B,Hq,S,D], k/v [B,Hkv,S,D], lse fp32
// [B,Hq,S]. bf16 with D = 64 or 128 runs tensor-core kernels (mma.sync, tiles in shared memory);
// other head dims and fp32 storage run a generic fp32 kernel. Backward writes dq, dk, dv; dq and
// dk/dv come from separate kernels (each owning its outputs), so no atomics are used.
// T: bf16 and float.
template <typename T>
void attention_forward(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, nd<T>* out, float* lse,
                       cudaStream_t s);
template <typename T>
void attention_backward(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, const nd<T>* out,
                        const float* lse, const nd<T>* dout, nd<T>* dq, nd<T>* dk, nd<T>* dv, cudaStream_t s);
// The generic kernels alone (what the float entry points run; tests compare both paths for
// bf16). T: bf16 and float.
template <typename T>
void attention_forward_generic(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v, nd<T>* out,
                               float* lse, cudaStream_t s);
template <typename T>
void attention_backward_generic(const ops::AttentionShape& p, const T* q, const nd<T>* k, const nd<T>* v,
                                const nd<T>* out, const float* lse, const nd<T>* dout, nd<T>* dq, nd<T>* dk, nd<T>* dv,
                                cudaStream_t s);
// True when the tensor-core kernels serve this shape and storage.
bool attention_uses_tensor_cores(const ops::AttentionShape& p);
// Which implementation serves the bf16 attention entry points (Megatron's --attention-backend).
// Flash: the kernels above. Fused: cuDNN's fused flash attention graph (attention_cudnn.h); an
// error where it cannot serve a call. Auto: cuDNN where it supports the call (bf16, no dropout,
// a shape its engines accept, cuDNN present), else the kernels above. Process-wide; default Auto.
// The fp32 instantiations always run the generic kernels.
enum class AttentionBackend { Auto, Flash, Fused };
void set_attention_backend(AttentionBackend b);
AttentionBackend attention_backend();
// "auto" | "flash" | "fused"; throws mt::Error listing the choices for anything else.
AttentionBackend attention_backend_from_name(const std::string& name);
// Whether the cuDNN attention backward must be run-to-run deterministic (default true). False
// (--nondeterministic-attention) allows its faster engine that accumulates dQ with atomics.
// Our flash kernels are always deterministic.
void set_attention_deterministic(bool deterministic);
bool attention_deterministic();

// ---- Activations and dropout (elementwise, fp32 math). Storage types.
// amax (f32 [1], may be null): set to max |output| as stored (the FP8 producer fusion, ops.def).
template <typename T>
void swiglu_forward(const T* x, nd<T>* y, int64_t rows, int64_t F, cudaStream_t s, float* amax = nullptr);
template <typename T>
void swiglu_backward(const T* dy, const nd<T>* x, nd<T>* dx, int64_t rows, int64_t F, cudaStream_t s,
                     float* amax = nullptr);
template <typename T>
void gelu_forward(const T* x, nd<T>* y, int64_t n, bool tanh_approx, cudaStream_t s);
template <typename T>
void gelu_backward(const T* dy, const nd<T>* x, nd<T>* dx, int64_t n, bool tanh_approx, cudaStream_t s);
// Keeps element i when Philox::uniform(seed, offset, i) >= p (the CPU's stream, bit for bit).
template <typename T>
void dropout_forward(const T* x, nd<T>* y, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t s);
template <typename T>
void dropout_backward(const T* dy, nd<T>* dx, int64_t n, float p, uint64_t seed, uint64_t offset, cudaStream_t s);
// Philox::uniform(seed, offset, first + i) for i < n, from the device generator (tests).
void philox_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, uint64_t first, cudaStream_t s);

// ---- Softmax cross-entropy over logits[N, V] (first valid_v columns), never materialising
// probabilities: forward is one online log-sum-exp pass per row (losses, lse fp32 [N]);
// backward writes dlogits = dloss * (softmax - onehot), 0 in padded columns. dlogits may be the
// logits buffer itself (in place). Storage types.
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, float* losses, float* lse, int64_t N, int64_t V,
                           int64_t valid_v, cudaStream_t s);
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                            nd<T>* dlogits, int64_t N, int64_t V, int64_t valid_v, cudaStream_t s);
// Forward and backward in one pass over the logits (training, where dloss is known up front):
// losses and lse as cross_entropy_forward, and dlogits as cross_entropy_backward (dlogits may be
// logits: in place). On sm_90 each row is read once into the shared memory of a cluster of
// CTAs, which combine their (max, sum of exp) through distributed shared memory, and its
// gradient written once; the result is deterministic for a given cluster size, which depends on
// V only (and the device's shared memory limit). cluster_ctas: 0 picks (the smallest of 1, 2, 4
// or 8 whose slice of a row fits ~72 KB, else 8 if it fits at all, else the two kernels); 1, 2,
// 4 or 8 forces that size (tests; throws if it does not fit); -1 runs the forward and backward
// kernels. Returns the cluster size used, 0 for the two kernels.
template <typename T>
int cross_entropy_fused(const T* logits, const int32_t* targets, const float* dloss, float* losses, float* lse,
                        nd<T>* dlogits, int64_t N, int64_t V, int64_t valid_v, cudaStream_t s, int cluster_ctas = 0);

// ---- Elementwise helpers and casts.
// y += x. (TY, TX): (bf16, bf16), (f16, f16), (float, float), and (float, bf16), (float, f16):
// the fp32 accumulation of a half gradient.
template <typename TY, typename TX>
void add_inplace(TY* y, const TX* x, int64_t n, cudaStream_t s);
template <typename T>  // storage types
void scale_inplace(T* y, float a, int64_t n, cudaStream_t s);
// Rounds to nearest even. (TI, TO): (float, bf16), (float, f16), (bf16, float), (f16, float).
template <typename TI, typename TO>
void cast(const TI* x, TO* y, int64_t n, cudaStream_t s);

// ---- Optimizer. AdamW as kernels/cpu/optimizer.cpp (torch's AdamW): decoupled decay, bias
// correction, fp32 moments, the same fp32 operations in the same order without FMA contraction, so
// the update equals the CPU's bit for bit. Multi-tensor: one launch covers up to 24 tensors of any
// size; longer lists take several launches. param_bf16 (optional) receives the rounded update.
struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  bf16* param_bf16 = nullptr;
  int64_t numel = 0;
  bool weight_decay = true;
  f16* param_f16 = nullptr;  // the --fp16 compute copy instead (a call sets one kind or none)
};
struct AdamWHyper {
  double lr = 1e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t step = 1;  // 1-based step count after increment (as the CPU's step_)
  float grad_scale = 1.f;  // the clip coefficient (ops::AdamWStep)
};
void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, cudaStream_t s);
// SGD as kernels/cpu/optimizer.cpp (torch's SGD as Megatron sets it up), bit for bit in the same
// way: d = g + wd*p (decayed tensors), b = first ? d : b*momentum + d (with a momentum buffer),
// p += -lr*b. The compute copies as AdamW's.
struct SGDTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buffer = nullptr;  // null: no momentum
  bf16* param_bf16 = nullptr;
  f16* param_f16 = nullptr;
  int64_t numel = 0;
  bool weight_decay = true;
};
struct SGDHyper {
  float lr = 0, weight_decay = 0, momentum = 0;
  bool first = false;  // the momentum buffer starts as this step's d
  float grad_scale = 1.f;  // the clip coefficient (ops::SGDStep)
};
void sgd_step(const std::vector<SGDTensor>& tensors, const SGDHyper& h, cudaStream_t s);

// Sum of squares of all elements of a list of fp32 buffers, in fp64, into *out_norm_sq (device
// pointer): fixed chunks summed by fixed trees, chunk sums added in a fixed order.
struct GradSpan {
  float* data = nullptr;
  int64_t numel = 0;
};
void grad_norm_squared(const std::vector<GradSpan>& spans, double* out_norm_sq, cudaStream_t s);
// Same, returned to the host (synchronises the stream).
double grad_norm_squared_host(const std::vector<GradSpan>& spans, cudaStream_t s);
// Megatron's clip: c = max_norm / (sqrt(*norm_sq) + 1e-6), applied when c < 1 (a NaN norm leaves
// the grads alone). Reads the norm on the device: no host sync.
void clip_grads(const std::vector<GradSpan>& spans, const double* norm_sq, double max_norm, cudaStream_t s);
// Loss scaling (--fp16): grads *= inv_scale over every span, and *found_inf (a device int) is set
// to 1 if any result is inf or nan (never cleared here: the caller zeroes it once per step).
// The same fp32 product as ops::unscale_and_check on the CPU. No host sync.
void unscale_and_check(const std::vector<GradSpan>& spans, float inv_scale, int32_t* found_inf, cudaStream_t s);

}  // namespace mt::cuda
