// Linear layers on cuBLASLt. cuBLAS is column-major, and a row-major [R, C] matrix is the
// column-major C x R matrix, so with w stored [N, K], x [M, K], y [M, N] (all row-major):
//   forward  y (col-major N x M)  = op(w: K x N)^T * (x: K x M)          "TN", the layout Hopper likes
//   dgrad    dx (col-major K x M) = (w: K x N) * (dy: N x M)             "NN"
//   wgrad    dw (col-major K x N) += (x: K x M) * op(dy: N x M)^T        "NT", beta = 1 into fp32
// Descriptors, layouts and up to lt_tune::candidates() of the heuristic's algorithms are cached per
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
// per tuned shape to stderr): lt_tune.h, shared with the FP8 GEMMs. Each plan keeps up to
// lt_tune::candidates() of the heuristic's algorithms; its first call times them on the call's
// inputs and keeps the fastest whose output is bit-identical to the heuristic default's.
#include <cublasLt.h>

#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lt_tune.h"
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

int elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

struct Candidate {
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<Candidate> cands;  // in the heuristic's order; [0] is its choice, the untuned default
  lt_tune::State tune;
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
  lt_tune::Tuner tuner{lt_tune::mode_from(std::getenv("MT_GEMM_TUNE"))};

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
    int use = tuner.settled(p.tune);
    if (use < 0) use = tuner.tune(p.tune, tune_job(p, call, s), s);
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

  // What tuning p on this call times (lt_tune.h): the call's operands, and a run of one candidate.
  lt_tune::Job tune_job(const Plan& p, const Call& call, cudaStream_t s) {
    lt_tune::Job j;
    j.what = "gemm";
    j.m = call.m, j.n = call.n, j.k = call.k, j.beta = call.beta;
    const int ab = elem_bytes(call.ab_type);
    j.a = {call.A, ab, call.transa ? call.k : call.m, call.transa ? call.m : call.k, call.lda};
    j.b = {call.B, ab, call.transb ? call.n : call.k, call.transb ? call.k : call.n, call.ldb};
    j.d = {call.D, elem_bytes(call.d_type), call.m, call.n, call.ldd};
    j.in_place = call.beta != 0.f && call.in_place();
    j.count = static_cast<int>(p.cands.size());
    j.run = [this, &p, call, s](int i, void* out) {
      return run(p, p.cands[i], call, out, s) == CUBLAS_STATUS_SUCCESS;
    };
    return j;
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
    std::array<cublasLtMatmulHeuristicResult_t, lt_tune::kMaxCandidates> res{};
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, lt_tune::candidates(), res.data(), &count);
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
  impl_->tuner.mode.on = on;
}
bool Gemm::tuning() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tuner.mode.on;
}
int Gemm::tuned_shapes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->tuner.tuned;
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
