// Linear layers on cuBLASLt. cuBLAS is column-major, and a row-major [R, C] matrix is the
// column-major C x R matrix, so with w stored [N, K], x [M, K], y [M, N] (all row-major):
//   forward  y (col-major N x M)  = op(w: K x N)^T * (x: K x M)          "TN", the layout Hopper likes
//   dgrad    dx (col-major K x M) = (w: K x N) * (dy: N x M)             "NN"
//   wgrad    dw (col-major K x N) += (x: K x M) * op(dy: N x M)^T        "NT", beta = 1 into fp32
// Descriptors, layouts and the heuristic's algorithm are cached per (shape, types, alignment,
// epilogue), so steady-state calls are one cublasLtMatmul. The bias epilogue adds b in the
// GEMM's output stage; db is a deterministic column-sum kernel.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

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

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

// Key: m, n, k, lda, ldb, ldc, transa, transb, a/b type, c/d type, epilogue, 4 alignments.
using Key = std::array<int64_t, 15>;

// db[n] += sum over rows of dy[M, N]: each thread owns columns, rows summed in a fixed order in
// fixed-size row chunks (partials[chunk][N]), then the chunks in order.
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
__global__ void column_finish_kernel(const float* __restrict__ partial, float* __restrict__ db, int64_t chunks,
                                     int64_t N) {
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= N) return;
  float acc = 0.f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * N + col];
  db[col] += acc;
}

template <typename T>
void column_sum_add(const T* dy, float* db, int64_t M, int64_t N, cudaStream_t s) {
  const int64_t chunks = ceil_div(M, kRowChunk);
  Scratch part(static_cast<size_t>(chunks * N) * sizeof(float), s);
  dim3 grid(static_cast<unsigned>(ceil_div(N, 256)), static_cast<unsigned>(chunks));
  column_partial_kernel<<<grid, 256, 0, s>>>(dy, part.as<float>(), M, N);
  MT_CUDA_LAUNCH_CHECK();
  column_finish_kernel<<<static_cast<unsigned>(ceil_div(N, 256)), 256, 0, s>>>(part.as<float>(), db, chunks, N);
  MT_CUDA_LAUNCH_CHECK();
}

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, Plan> plans;
  std::mutex mu;

  ~Impl() {
    for (auto& [k, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
    }
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }

  // Column-major D[m,n] = alpha * op(A) op(B) + beta * C, C == D. A is (transa ? k x m : m x k)
  // with leading dim lda, B is (transb ? n x k : k x n) with ldb.
  void matmul(bool transa, bool transb, int64_t m, int64_t n, int64_t k, const void* A, int64_t lda, const void* B,
              int64_t ldb, cudaDataType_t ab_type, float beta, void* D, int64_t ldd, cudaDataType_t d_type,
              const void* bias, cudaStream_t s) {
    const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    const Key key{m,
                  n,
                  k,
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
                  bias ? alignment_of(bias) : 0};
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    if (it == plans.end())
      it = plans.emplace(key, make_plan(key, transa, transb, m, n, k, lda, ldb, ldd, ab_type, d_type, epi)).first;
    Plan& p = it->second;
    if (bias)
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    const float alpha = 1.f;
    MT_CUBLAS_CHECK(cublasLtMatmul(handle, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.c, D, p.c, &p.algo, workspace,
                                   p.workspace, s));
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
    const uint32_t al[4] = {static_cast<uint32_t>(key[11]), static_cast<uint32_t>(key[12]),
                            static_cast<uint32_t>(key[13]), static_cast<uint32_t>(key[13])};
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
    cublasLtMatmulHeuristicResult_t res{};
    int count = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || count == 0)
      fail("cuBLASLt found no algorithm for a {}x{}x{} GEMM (types {}/{}, epilogue {}): status {}", m, n, k,
           static_cast<int>(ab_type), static_cast<int>(d_type), static_cast<int>(epi), static_cast<int>(st));
    p.algo = res.algo;
    p.workspace = res.workspaceSize;
    return p;
  }
};

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  MT_CUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes) MT_CUDA_CHECK(cudaMalloc(&impl_->workspace, workspace_bytes));
}
Gemm::~Gemm() = default;

namespace {

template <typename TI, typename TO>
void forward_impl(Gemm& g, const TI* x, const TI* w, const TO* b, TO* y, int64_t M, int64_t N, int64_t K,
                  cudaStream_t s, cudaDataType_t ti, cudaDataType_t to) {
  if (M == 0 || N == 0) return;
  MT_CHECK(K > 0, "linear_forward with K = 0 is not supported on the GPU");
  g.impl()->matmul(true, false, N, M, K, w, K, x, K, ti, 0.f, y, N, to, b, s);
}

template <typename T>
void backward_impl(Gemm& g, const T* dy, const T* x, const T* w, T* dx, float* dw, float* db, int64_t M, int64_t N,
                   int64_t K, cudaStream_t s, cudaDataType_t t) {
  if (M == 0 || N == 0 || K == 0) return;
  if (dx) g.impl()->matmul(false, false, K, M, N, w, K, dy, N, t, 0.f, dx, K, t, nullptr, s);
  if (dw) g.impl()->matmul(false, true, K, N, M, x, K, dy, N, t, 1.f, dw, K, CUDA_R_32F, nullptr, s);
  if (db) column_sum_add(dy, db, M, N, s);
}

}  // namespace

void linear_forward(Gemm& g, const bf16* x, const bf16* w, const bf16* b, bf16* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s) {
  forward_impl(g, x, w, b, y, M, N, K, s, CUDA_R_16BF, CUDA_R_16BF);
}
void linear_forward(Gemm& g, const f16* x, const f16* w, const f16* b, f16* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s) {
  forward_impl(g, x, w, b, y, M, N, K, s, CUDA_R_16F, CUDA_R_16F);
}
void linear_forward(Gemm& g, const bf16* x, const bf16* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s) {
  forward_impl(g, x, w, b, y, M, N, K, s, CUDA_R_16BF, CUDA_R_32F);
}
void linear_forward(Gemm& g, const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                    cudaStream_t s) {
  forward_impl(g, x, w, b, y, M, N, K, s, CUDA_R_32F, CUDA_R_32F);
}
void linear_backward(Gemm& g, const bf16* dy, const bf16* x, const bf16* w, bf16* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K, cudaStream_t s) {
  backward_impl(g, dy, x, w, dx, dw, db, M, N, K, s, CUDA_R_16BF);
}
void linear_backward(Gemm& g, const f16* dy, const f16* x, const f16* w, f16* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K, cudaStream_t s) {
  backward_impl(g, dy, x, w, dx, dw, db, M, N, K, s, CUDA_R_16F);
}
void linear_backward(Gemm& g, const float* dy, const float* x, const float* w, float* dx, float* dw, float* db,
                     int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  backward_impl(g, dy, x, w, dx, dw, db, M, N, K, s, CUDA_R_32F);
}

}  // namespace mt::cuda
