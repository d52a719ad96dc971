// Linear layers on cuBLASLt. cuBLAS is column-major, and a row-major [R, C] matrix is the
// column-major C x R matrix, so with w stored [N, K], x [M, K], y [M, N] (all row-major):
//   forward  y (col-major N x M)  = op(w: K x N)^T * (x: K x M)          "TN", the layout Hopper likes
//   dgrad    dx (col-major K x M) = (w: K x N) * (dy: N x M)             "NN"
//   wgrad    dw (col-major K x N) += (x: K x M) * op(dy: N x M)^T        "NT", beta = 1 into fp32
// Descriptors, layouts and up to tune_candidates() of the heuristic's algorithms are cached per
// (shape, types, alignment, epilogue), so steady-state calls are one cublasLtMatmul. The bias
// epilogue adds b in the GEMM's output stage; db is a deterministic column-sum kernel.
// Residual forward (linear_forward_residual): y = x w^T + b + r in one GEMM, r as cuBLASLt's C
// (beta = 1, same type and layout as D, read-only) and y as a separate D. cublasLt.h documents
// the bias as "added before applying final postprocessing" of D = alpha op(A) op(B) + beta C: the
// epilogue sums the fp32 accumulator, beta * C and the bias in fp32 (the scale type) and rounds to
// D's type once. Which of the two fp32 adds comes first is not documented (with alpha = 1 both
// readings are the same math, within an fp32 ulp), so the reference is that fp32 sum rounded once.
//
// Autotuning (on by default; MT_GEMM_TUNE=0 turns it off, MT_GEMM_TUNE=verbose prints one line
// per tuned shape to stderr). The heuristic's first choice is an estimate and need not be the
// fastest kernel, so the first call of each plan (up to kMaxTunedPlans) times every candidate on the call's real inputs
// (one stream synchronisation per shape, in the first training step) and keeps the fastest. Different kernels may sum in a different order, and the project promises
// bit-identical results run to run and with tuning off, so a candidate is only eligible when
// its output is bit-identical (a 64-bit digest of every output element) to the heuristic
// default's on those inputs; inputs that are mostly zero cannot tell summation orders apart, so
// tuning waits for a later call (and gives up after kMaxDeferrals). In-place beta != 0 calls (the
// fp32 wgrad accumulation, C == D) are tuned on a scratch copy of D, so D is accumulated exactly
// once, by the real call. With a separate C (the residual forward) the candidates read C, never
// write it, and write D, which the real call then overwrites: no copy needed.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/device.h"

namespace mt::cuda {

namespace {

void check_cublas(cublasStatus_t st, const char* what, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error {} in {} (gemm.cu:{})", static_cast<int>(st), what, line);
}
#define MT_CUBLAS_CHECK(x) check_cublas((x), #x, __LINE__)

int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % static_cast<uintptr_t>(al)) != 0) al >>= 1;
  return al;
}

size_t elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

// Heuristic results kept per plan: enough to hold the kernels that are fastest at our shapes,
// few enough that timing them all on the first call stays well under a second per shape.
constexpr int kMaxTuneCandidates = 32;
// MT_GEMM_TUNE_CANDIDATES (1..32, default 8) sets how many of the heuristic's results a plan
// keeps and times: a benchmarking knob.
int tune_candidates() {
  static const int n = [] {
    const char* v = std::getenv("MT_GEMM_TUNE_CANDIDATES");
    const int k = v ? std::atoi(v) : 8;
    return k < 1 ? 1 : k > kMaxTuneCandidates ? kMaxTuneCandidates : k;
  }();
  return n;
}
constexpr int kTuneRuns = 5;       // timed runs per candidate (rounds over all candidates); the median counts
constexpr int kMaxDeferrals = 3;   // calls with uninformative inputs before a plan keeps its default
constexpr double kMinGain = 0.01;  // a candidate must beat the default by this fraction

struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<Candidate> cands;  // in the heuristic's order; [0] is its choice, the untuned default
  int chosen = -1;               // index into cands once tuned (or given up on); -1 before
  int deferrals = 0;
  bool bucket = false;  // made for a row-count bucket: its layouts are resized to each call's shape
};

// Row counts (the tokens: a linear layer's M) are bucketed. The MoE experts' row counts change
// with the routing, every step and every layer: an exact-shape plan per count meant a descriptor
// set and a heuristic query on the host for nearly every expert GEMM (and a plan map that grows
// with the run). A bucket's plan holds the heuristic's algorithms for the bucket's largest count
// and runs any count in it by resizing its layouts. Dense layers' token counts are multiples of
// 256 in practice and get the plan of their exact shape, as before. The choice depends only on
// the shape, never on which shapes came first, so runs (and resumed runs) keep the same bits.
int64_t row_bucket(int64_t rows) {
  if (rows > 256) return (rows + 255) / 256 * 256;
  int64_t b = 16;
  while (b < rows) b *= 2;
  return b;
}

// How many plans a process tunes: the dense model's shapes are a few dozen; the MoE experts' row
// counts change with the routing, so their shapes keep coming and each would cost a tuning pass
// (a stream sync and ~tens of ms). Past the cap, new plans keep the heuristic's default.
constexpr int kMaxTunedPlans = 128;

// Key: m, n, k, lda, ldb, ldc, transa, transb, a/b type, c/d type, epilogue, alignments of A, B,
// D and the bias, and of a separate C (0 when C is D): a residual GEMM gets its own plan, tuned
// and guarded with its epilogue reading C.
// The last slot marks an exact-shape fallback plan (1) apart from a bucket's (0).
using Key = std::array<int64_t, 17>;
constexpr size_t kKeyAlignA = 11, kKeyAlignB = 12, kKeyAlignD = 13, kKeyAlignC = 15, kKeyExact = 16;

// One matmul's operands: column-major D[m,n] = op(A) op(B) + beta * C. C is D (accumulation in
// place) or a separate, read-only matrix of D's type and layout.
struct Call {
  bool transa, transb;
  int64_t m, n, k, lda, ldb, ldd;
  const void* A;
  const void* B;
  const void* C;
  void* D;
  float beta;
  cudaDataType_t ab_type, d_type;
  bool in_place() const { return C == D; }
  // Bytes from D's first element to its last (the padding between columns included).
  size_t d_span() const { return static_cast<size_t>((n - 1) * ldd + m) * elem_bytes(d_type); }
};

// ---- Digests for the tuning guard. Each element of a column-major matrix contributes
// mix64(position, bits); the contributions are added mod 2^64, which does not depend on the
// order, so integer atomics keep the digest deterministic. Any changed bit changes the sum
// except with probability ~2^-64. The same pass counts the non-zero elements (+-0 are zero).
struct Digest {
  unsigned long long hash, nonzero;
};

// splitmix64's finaliser: a bijection that spreads every input bit over the output.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename W>
__global__ void digest_kernel(const W* __restrict__ p, int64_t rows, int64_t cols, int64_t ld, Digest* out) {
  constexpr W kMagnitude = static_cast<W>(~W{0}) >> 1;  // all bits but the sign
  uint64_t h = 0, nz = 0;
  for (int64_t j = blockIdx.y; j < cols; j += gridDim.y)
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const W w = p[j * ld + i];
      h += mix64((static_cast<uint64_t>(j * rows + i) * 0x9e3779b97f4a7c15ull) ^ w);
      nz += (w & kMagnitude) != 0;
    }
  for (int off = 16; off > 0; off >>= 1) {
    h += __shfl_down_sync(0xffffffffu, h, off);
    nz += __shfl_down_sync(0xffffffffu, nz, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&out->hash, static_cast<unsigned long long>(h));
    atomicAdd(&out->nonzero, static_cast<unsigned long long>(nz));
  }
}

// Adds the digest of p (rows x cols, leading dim ld, elements of type t) into *out (zeroed by the
// caller), in stream order.
void digest(const void* p, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, Digest* out, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(ceil_div(rows, 256), 32)),
                  static_cast<unsigned>(std::min<int64_t>(cols, 2048)));
  if (elem_bytes(t) == 4)
    digest_kernel<<<grid, 256, 0, s>>>(static_cast<const uint32_t*>(p), rows, cols, ld, out);
  else
    digest_kernel<<<grid, 256, 0, s>>>(static_cast<const uint16_t*>(p), rows, cols, ld, out);
  MT_CUDA_LAUNCH_CHECK();
}

// Stream-ordered device memory that may fail: tuning is optional, so running out of memory for
// it means "not now" rather than an error. Aligned to 256 bytes, as the plan's D may be.
class TuneBuffer {
 public:
  TuneBuffer(size_t bytes, cudaStream_t s) : s_(s) {
    if (bytes && cudaMallocAsync(&raw_, bytes + 256, s) != cudaSuccess) {
      raw_ = nullptr;
      cudaGetLastError();  // clear it, or the next launch check would report it
    }
  }
  ~TuneBuffer() {
    if (raw_) cudaFreeAsync(raw_, s_);
  }
  TuneBuffer(const TuneBuffer&) = delete;
  TuneBuffer& operator=(const TuneBuffer&) = delete;
  template <typename T>
  T* as() const {
    if (!raw_) return nullptr;
    const uintptr_t a = (reinterpret_cast<uintptr_t>(raw_) + 255) & ~uintptr_t{255};
    return reinterpret_cast<T*>(a);
  }

 private:
  void* raw_ = nullptr;
  cudaStream_t s_;
};

// What timing one candidate found, read back after the stream synchronises.
struct Trial {
  bool ran = false;
  std::array<cudaEvent_t, 2 * kTuneRuns> ev{};
  float ms = 0;  // median of the timed runs
};

// db[n] += sum over rows of dy[M, N]: each thread owns columns, rows summed in a fixed order in
// fixed-size row chunks (partials[chunk][N]), then the chunks by partial_rows_sum_add (common.cuh:
// fixed assignment and order, parallel over chunks so that few columns still fill the GPU).
constexpr int kRowChunk = 256;
template <typename T>
__global__ void column_partial_kernel(const T* __restrict__ dy, float* __restrict__ partial, int64_t M, int64_t N) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= N) return;
  const int64_t r0 = blockIdx.y * static_cast<int64_t>(kRowChunk);
  const int64_t r1 = min(M, r0 + kRowChunk);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r) acc += to_f(dy[r * N + col]);
  partial[blockIdx.y * N + col] = acc;
}

template <typename T>
void column_sum_add(const T* dy, float* db, int64_t M, int64_t N, cudaStream_t s) {
  const int64_t chunks = ceil_div(M, kRowChunk);
  Scratch part(static_cast<size_t>(chunks * N) * sizeof(float), s);
  dim3 grid(static_cast<unsigned>(ceil_div(N, 256)), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, 256, 0, s>>>(dy, part.as<float>(), M, N);
  MT_CUDA_LAUNCH_CHECK();
  partial_rows_sum_add(part.as<float>(), db, chunks, N, s);
}

// MT_GEMM_TUNE: unset or anything else -> on; 0/off/false/no -> off; verbose -> on, with a line
// per tuned shape.
struct TuneMode {
  bool on = true, verbose = false;
};
TuneMode tune_mode_from_env() {
  const char* v = std::getenv("MT_GEMM_TUNE");
  if (!v) return {};
  for (const char* off : {"0", "off", "false", "no"})
    if (std::strcmp(v, off) == 0) return {false, false};
  return {true, std::strcmp(v, "verbose") == 0};
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, Plan> plans;
  // GEMMs may run on several streams at once (cuda::SideStreams): each stream gets its own
  // workspace, the constructor's going to the first stream that asks.
  std::map<cudaStream_t, void*> stream_workspaces;
  std::mutex mu;
  TuneMode tune = tune_mode_from_env();
  int tuned_plans = 0;
  int tune_attempts = 0;  // tune_plan calls (deferred ones included): bounded by kMaxTunedPlans

  ~Impl() {
    for (auto& [k, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
    }
    for (auto& [s, w] : stream_workspaces)
      if (w != workspace) cudaFree(w);
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  // Column-major D[m,n] = alpha * op(A) op(B) + beta * C. A is (transa ? k x m : m x k) with
  // leading dim lda, B is (transb ? n x k : k x n) with ldb. C: null (or D) for C == D, else a
  // separate matrix with D's type and leading dim, only read.
  // rows_dim: which of m (0), n (1), k (2) is the row count (bucketed, see row_bucket).
  void matmul(bool transa, bool transb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda, const void* B,
              int64_t ldb, cudaDataType_t ab_type, float beta, const void* C, void* D, int64_t ldd,
              cudaDataType_t d_type, const void* bias, cudaStream_t s, int rows_dim) {
    if (!C) C = D;
    const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    std::array<int64_t, 3> dims{m, n, k};
    dims[rows_dim] = row_bucket(dims[rows_dim]);
    const Key key{dims[0],
                  dims[1],
                  dims[2],
                  lda,
                  ldb,
                  ldd,
                  transa,
                  transb,
                  ab_type,
                  d_type,
                  epi,
                  alignment_of(A),
                  alignment_of(B),
                  alignment_of(D),
                  bias ? alignment_of(bias) : 0,
                  C != D ? alignment_of(C) : 0,
                  0};
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    if (it == plans.end()) {
      Plan made = make_plan(key, transa, transb, dims[0], dims[1], dims[2], lda, ldb, ldd, ab_type, d_type, epi);
      made.bucket = true;
      it = plans.emplace(key, made).first;
    }
    Plan& p = it->second;
    resize(p, transa, transb, m, n, k);
    if (bias)
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const Call call{transa, transb, m, n, k, lda, ldb, ldd, A, B, C, D, beta, ab_type, d_type};
    int use = 0;
    if (tune.on && p.chosen < 0 && tune_attempts >= kMaxTunedPlans) p.chosen = 0;
    if (tune.on) use = p.chosen >= 0 ? p.chosen : (++tune_attempts, tune_plan(p, call, s));
    const cublasStatus_t st = run(p, p.cands[use], call, D, s);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    // The bucket's algorithm cannot run this count (cuBLASLt says so before launching anything):
    // an exact-shape plan for it, kept under its own key.
    const bool resized = dims[0] != m || dims[1] != n || dims[2] != k;
    MT_CHECK(st == CUBLAS_STATUS_NOT_SUPPORTED && resized, "cuBLASLt error {} in a {}x{}x{} GEMM",
             static_cast<int>(st), m, n, k);
    Key exact = key;
    exact[0] = m, exact[1] = n, exact[2] = k;
    exact[kKeyExact] = 1;
    auto ex = plans.find(exact);
    if (ex == plans.end())
      ex = plans.emplace(exact, make_plan(exact, transa, transb, m, n, k, lda, ldb, ldd, ab_type, d_type, epi)).first;
    if (bias)
      MT_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(ex->second.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    MT_CUBLAS_CHECK(run(ex->second, ex->second.cands[0], call, D, s));
  }

  // A bucket plan's layouts take the call's own sizes (its leading dimensions never change).
  static void resize(Plan& p, bool transa, bool transb, int64_t m, int64_t n, int64_t k) {
    if (!p.bucket) return;
    auto set = [](cublasLtMatrixLayout_t l, int64_t rows, int64_t cols) {
      const uint64_t r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
      MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
      MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
    };
    set(p.a, transa ? k : m, transa ? m : k);
    set(p.b, transb ? n : k, transb ? k : n);
    set(p.c, m, n);
  }

  // out = op(A) op(B) + beta * C with one candidate; C is out itself where the call accumulates
  // in place (so a scratch `out` starts from its copy of D), else the call's separate C.
  cublasStatus_t run(const Plan& p, const Candidate& c, const Call& call, void* out, cudaStream_t s) {
    const float alpha = 1.f;
    const void* C = call.in_place() ? out : call.C;
    return cublasLtMatmul(handle, p.desc, &alpha, call.A, p.a, call.B, p.b, &call.beta, C, p.c, out, p.c, &c.algo,
                          workspace_for(s), c.workspace, s);
  }

  void* workspace_for(cudaStream_t s) {
    auto it = stream_workspaces.find(s);
    if (it != stream_workspaces.end()) return it->second;
    void* w = workspace;
    if (!stream_workspaces.empty() && workspace_bytes) MT_CUDA_CHECK(cudaMalloc(&w, workspace_bytes));
    stream_workspaces.emplace(s, w);
    return w;
  }

  // Times every candidate on the call's inputs and returns the index to use now; sets p.chosen
  // unless tuning is put off. Synchronises the stream once: this happens on a plan's first call
  // (the first training step), never in the steady state.
  int tune_plan(Plan& p, const Call& call, cudaStream_t s) {
    const int n = static_cast<int>(p.cands.size());
    if (n == 1) return p.chosen = 0;
    // Beta == 0 or a separate C: the candidates may write D, the real call overwrites it.
    // Accumulating in place, they accumulate into a copy of D (restored before each checked run).
    const bool scratch = call.beta != 0.f && call.in_place();
    TuneBuffer copy(scratch ? call.d_span() : 0, s);
    TuneBuffer digests((2 + 2 * n) * sizeof(Digest), s);
    void* out = scratch ? copy.as<void>() : call.D;
    Digest* dg = digests.as<Digest>();
    if (!out || !dg) return defer(p, call, "no memory for tuning");
    MT_CUDA_CHECK(cudaMemsetAsync(dg, 0, (2 + 2 * n) * sizeof(Digest), s));
    digest(call.A, call.ab_type, call.transa ? call.k : call.m, call.transa ? call.m : call.k, call.lda, &dg[0], s);
    digest(call.B, call.ab_type, call.transb ? call.n : call.k, call.transb ? call.k : call.n, call.ldb, &dg[1], s);
    std::vector<Trial> trials(n);
    for (int i = 0; i < n; ++i) trials[i].ran = check_candidate(p, i, call, out, &dg[2 + 2 * i], s);
    time_candidates(p, trials, call, out, s);
    std::vector<Digest> host(2 + 2 * n);
    MT_CUDA_CHECK(cudaMemcpyAsync(host.data(), dg, host.size() * sizeof(Digest), cudaMemcpyDeviceToHost, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    for (Trial& t : trials) t.ms = median_ms(t);
    if (!informative(host[0], call.m, call.k) || !informative(host[1], call.k, call.n))
      return defer(p, call, "inputs mostly zero");
    return p.chosen = pick(trials, host, call);
  }

  // Runs candidate i twice from the same starting D (and the same C), digesting each output into
  // dg[0] and dg[1] (the guard compares both with the default's first). False when it cannot run.
  // Stream order.
  bool check_candidate(const Plan& p, int i, const Call& call, void* out, Digest* dg, cudaStream_t s) {
    for (int rep = 0; rep < 2; ++rep) {
      if (out != call.D) MT_CUDA_CHECK(cudaMemcpyAsync(out, call.D, call.d_span(), cudaMemcpyDeviceToDevice, s));
      if (run(p, p.cands[i], call, out, s) != CUBLAS_STATUS_SUCCESS) return false;
      digest(out, call.d_type, call.m, call.n, call.ldd, &dg[rep], s);
    }
    return true;
  }

  // kTuneRuns rounds, each timing every runnable candidate once, back to back: no copies or
  // digests between the timed runs (they would leave L2 and clocks in a state the real calls do
  // not see) and interleaved so that drift in clocks or temperature spreads over all candidates.
  // In-place beta != 0 runs keep accumulating into the scratch copy: its values no longer matter.
  void time_candidates(const Plan& p, std::vector<Trial>& trials, const Call& call, void* out, cudaStream_t s) {
    for (Trial& t : trials)
      if (t.ran)
        for (cudaEvent_t& e : t.ev) MT_CUDA_CHECK(cudaEventCreate(&e));
    for (int r = 0; r < kTuneRuns; ++r)
      for (size_t i = 0; i < trials.size(); ++i) {
        if (!trials[i].ran) continue;
        MT_CUDA_CHECK(cudaEventRecord(trials[i].ev[2 * r], s));
        MT_CUBLAS_CHECK(run(p, p.cands[i], call, out, s));  // it ran before, so a failure now is an error
        MT_CUDA_CHECK(cudaEventRecord(trials[i].ev[2 * r + 1], s));
      }
  }

  // Reads a synchronised trial's events (and destroys them).
  static float median_ms(Trial& t) {
    if (!t.ran) return 0;
    std::array<float, kTuneRuns> ms{};
    for (int r = 0; r < kTuneRuns; ++r) {
      MT_CUDA_CHECK(cudaEventElapsedTime(&ms[r], t.ev[2 * r], t.ev[2 * r + 1]));
      cudaEventDestroy(t.ev[2 * r]);
      cudaEventDestroy(t.ev[2 * r + 1]);
    }
    std::sort(ms.begin(), ms.end());
    return ms[kTuneRuns / 2];
  }

  // Whether a rows x cols input can tell summation orders apart: mostly zero inputs (zero-
  // initialised weights, masked gradients) make every order agree, and the guard would pass
  // candidates that differ on later data.
  static bool informative(const Digest& d, int64_t rows, int64_t cols) {
    return d.nonzero * 8 >= static_cast<unsigned long long>(rows * cols);
  }

  int defer(Plan& p, const Call& call, const char* why) {
    if (++p.deferrals >= kMaxDeferrals) p.chosen = 0;
    if (tune.verbose)
      std::fprintf(stderr, "gemm tune m=%lld n=%lld k=%lld: put off (%s)%s\n", static_cast<long long>(call.m),
                   static_cast<long long>(call.n), static_cast<long long>(call.k), why,
                   p.chosen == 0 ? ", keeping the default" : "");
    return 0;
  }

  // The fastest candidate whose two checked outputs are bit-identical to the default's first
  // one; the default unless one beats it by kMinGain. host: digests of A, B, then two
  // per candidate.
  int pick(const std::vector<Trial>& trials, const std::vector<Digest>& host, const Call& call) {
    const unsigned long long ref = host[2].hash;
    int best = 0, survivors = 0;
    // A default that is not itself reproducible leaves nothing to compare with: keep it.
    const bool ref_ok = trials[0].ran && host[3].hash == ref;
    for (int i = 0; ref_ok && i < static_cast<int>(trials.size()); ++i) {
      if (!trials[i].ran || host[2 + 2 * i].hash != ref || host[3 + 2 * i].hash != ref) continue;
      ++survivors;
      if (trials[i].ms < trials[best].ms) best = i;
    }
    if (trials[best].ms > (1.0 - kMinGain) * trials[0].ms) best = 0;
    ++tuned_plans;
    if (tune.verbose) {
      int fastest = best;  // any candidate, bit-identical or not: what the guard costs
      for (int i = 0; i < static_cast<int>(trials.size()); ++i)
        if (trials[i].ran && trials[i].ms < trials[fastest].ms) fastest = i;
      std::fprintf(
          stderr,
          "gemm tune m=%lld n=%lld k=%lld beta=%g: default %.4f ms, chosen #%d %.4f ms (%.1f%% faster), "
          "%d of %zu candidates bit-identical; fastest of all #%d %.4f ms\n",
          static_cast<long long>(call.m), static_cast<long long>(call.n), static_cast<long long>(call.k),
          static_cast<double>(call.beta), static_cast<double>(trials[0].ms), best, static_cast<double>(trials[best].ms),
          trials[best].ms > 0 ? 100.0 * (trials[0].ms / trials[best].ms - 1.0) : 0.0, survivors, trials.size(),
          fastest, static_cast<double>(trials[fastest].ms));
    }
    return best;
  }

  Plan make_plan(const Key& key, bool transa, bool transb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                 int64_t ldd, cudaDataType_t ab_type, cudaDataType_t d_type, cublasLtEpilogue_t epi) {
    Plan p;
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epi == CUBLASLT_EPILOGUE_BIAS) {
      const int32_t bt = d_type;  // the bias has the output's type (cuBLASLt's rule for non-fp8)
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
    }
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab_type, transa ? k : m, transa ? m : k, lda));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab_type, transb ? n : k, transb ? k : n, ldb));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, d_type, m, n, ldd));

    cublasLtMatmulPreference_t pref = nullptr;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = workspace_bytes;
    MT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const int64_t c_align = key[kKeyAlignC] ? key[kKeyAlignC] : key[kKeyAlignD];
    const uint32_t al[4] = {static_cast<uint32_t>(key[kKeyAlignA]), static_cast<uint32_t>(key[kKeyAlignB]),
                            static_cast<uint32_t>(c_align), static_cast<uint32_t>(key[kKeyAlignD])};
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
    std::array<cublasLtMatmulHeuristicResult_t, kMaxTuneCandidates> res{};
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, tune_candidates(), res.data(), &count);
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < count; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= workspace_bytes)
        p.cands.push_back({res[i].algo, res[i].workspaceSize});
    if (p.cands.empty())
      fail("cuBLASLt found no algorithm for a {}x{}x{} GEMM (types {}/{}, epilogue {}): status {}", m, n, k,
           static_cast<int>(ab_type), static_cast<int>(d_type), static_cast<int>(epi), static_cast<int>(st));
    return p;
  }
};

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  MT_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes) MT_CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}
Gemm::~Gemm() = default;

void Gemm::set_tuning(bool on) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->tune.on = on;
}
bool Gemm::tuning() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tune.on;
}
int Gemm::tuned_shapes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tuned_plans;
}
int Gemm::plans() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<int>(impl_->plans.size());
}

// The GEMV (half-precision inputs only) where cuBLASLt's small-row plans stay far below the
// memory bandwidth (gemv.cu).
bool gemv_applies(int64_t M) { return M <= kGemvChosenMaxRows && ops::InferenceGemv::active(); }

namespace {

// y = x w^T (+ b) (+ residual, y's type: cuBLASLt's C, with beta = 1).
template <typename TI, typename TO>
void forward_impl(Gemm& g, const TI* x, const TI* w, const TO* b, const void* residual, TO* y, int64_t M, int64_t N,
                  int64_t K, cudaStream_t s, cudaDataType_t ti, cudaDataType_t to) {
  if (M == 0 || N == 0) return;
  MT_CHECK(K > 0, "linear_forward with K = 0 is not supported on the GPU");
  if constexpr (!std::is_same_v<TI, float>) {
    if (gemv_applies(M)) return gemv_forward(x, w, b, static_cast<const TO*>(residual), y, M, N, K, s);
  }
  g.impl()->matmul(true, false, N, M, K, w, K, x, K, ti, residual ? 1.f : 0.f, residual, y, N, to, b, s, 1);
}

template <typename T>
void backward_impl(Gemm& g, const T* dy, const T* x, const T* w, T* dx, float* dw, float* db, int64_t M, int64_t N,
                   int64_t K, cudaStream_t s, cudaDataType_t t, bool accumulate_dw) {
  if (M == 0 || N == 0 || K == 0) return;
  if (dx) g.impl()->matmul(false, false, K, M, N, w, K, dy, N, t, 0.f, nullptr, dx, K, t, nullptr, s, 1);
  if (dw)
    g.impl()->matmul(false, true, K, N, M, x, K, dy, N, t, accumulate_dw ? 1.f : 0.f, nullptr, dw, K, CUDA_R_32F,
                     nullptr, s, 2);
  if (db) column_sum_add(dy, db, M, N, s);
}

// The cuBLASLt element type of a storage type.
template <typename T>
constexpr cudaDataType_t data_type() {
  return std::is_same_v<T, bf16> ? CUDA_R_16BF : std::is_same_v<T, f16> ? CUDA_R_16F : CUDA_R_32F;
}

}  // namespace

template <typename TI, typename TO>
void linear_forward(Gemm& g, const TI* x, const nd<TI>* w, const nd<TO>* b, TO* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s) {
  forward_impl(g, x, w, b, nullptr, y, M, N, K, s, data_type<TI>(), data_type<TO>());
}
template <typename TI, typename TO>
void linear_forward_residual(Gemm& g, const TI* x, const nd<TI>* w, const nd<TO>* b, const nd<TO>* residual, TO* y,
                             int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  forward_impl(g, x, w, b, residual, y, M, N, K, s, data_type<TI>(), data_type<TO>());
}
template <typename T>
void linear_backward(Gemm& g, const T* dy, const nd<T>* x, const nd<T>* w, nd<T>* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K, cudaStream_t s, bool accumulate_dw) {
  backward_impl(g, dy, x, w, dx, dw, db, M, N, K, s, data_type<T>(), accumulate_dw);
}

MT_INSTANTIATE_STORAGE2(linear_forward);
MT_INSTANTIATE(linear_forward, bf16, float);  // bf16 inputs, fp32 output
MT_INSTANTIATE_STORAGE2(linear_forward_residual);
MT_INSTANTIATE(linear_forward_residual, bf16, float);
MT_INSTANTIATE_STORAGE(linear_backward);

}  // namespace mt::cuda
