// The measurement behind --moe-grouped-gemm's choice (issue #17): the local experts' GEMMs of
// moe-2b (8 experts, hidden 2048, expert ffn 2048 SwiGLU, 4 x 2048 tokens top-2) run three ways
// on one GPU, forward, data gradient and weight gradient (fp32 accumulation, beta = 1):
//   loop    one cuBLASLt matmul per expert (the heuristic's first algorithm), today's path;
//   grouped cublasGemmGroupedBatchedEx, one call for all experts;
//   dense   one GEMM with every routed row (same FLOPs, no expert split): the ceiling.
// Built and run by hand on the GPU machine (not part of the CMake build):
//   nvcc -O2 -arch=sm_90a -std=c++17 bench/cuda/moe_gemm_probe.cu -lcublasLt -lcublas -o probe && ./probe
// Prints one JSON line per (matrix, pass, variant) with the median time and TFLOP/s.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <tuple>
#include <numeric>
#include <vector>

#define CK(x)                                                                   \
  do {                                                                          \
    auto e_ = (x);                                                              \
    if (e_ != 0) {                                                              \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, (int)e_, __LINE__); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace {

cublasLtHandle_t lt;
cublasHandle_t blas;
void* workspace;
constexpr size_t kWorkspace = 64u << 20;

// col-major D(m x n) = op(A) op(B) (+ beta D), A/B bf16, D of type dt. Descriptors and the
// heuristic's first algorithm are cached per shape, as the engine's Gemm does, so the loop times
// GPU work and one cublasLtMatmul call per expert, not descriptor set-up.
struct Plan {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
};
std::map<std::tuple<int, int, int, int, int, int, int, int, int>, Plan> plans;

void lt_gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* A, int lda, const void* B,
             int ldb, void* D, int ldd, cudaDataType_t dt, float beta) {
  const auto key = std::make_tuple((int)ta, (int)tb, m, n, k, lda, ldb, ldd, (int)dt);
  auto it = plans.find(key);
  if (it == plans.end()) {
    Plan p;
    CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    CK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    CK(cublasLtMatrixLayoutCreate(&p.ld, dt, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t h;
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.ld, p.ld, pref, 1, &h, &got));
    if (got == 0) std::exit(2);
    p.algo = h.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    it = plans.emplace(key, p).first;
  }
  const Plan& p = it->second;
  const float alpha = 1;
  CK(cublasLtMatmul(lt, p.op, &alpha, A, p.la, B, p.lb, &beta, D, p.ld, D, p.ld, &p.algo, workspace, kWorkspace, 0));
}

double median_ms(const std::function<void()>& f, int reps = 25) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class T>
T* dev(size_t n) {
  T* p;
  CK(cudaMalloc(&p, n * sizeof(T)));
  CK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}

void report(const char* mat, const char* pass, const char* variant, double ms, double flops) {
  std::printf("{\"probe\":\"moe-expert-gemm\",\"matrix\":\"%s\",\"pass\":\"%s\",\"variant\":\"%s\",\"ms\":%.4f,\"tflops\":%.1f}\n",
              mat, pass, variant, ms, flops / ms / 1e9);
}

}  // namespace

int main() {
  CK(cublasLtCreate(&lt));
  CK(cublasCreate(&blas));
  workspace = dev<char>(kWorkspace);
  CK(cublasSetWorkspace(blas, workspace, kWorkspace));
  // A realistic aux-loss-balanced split of 16,384 routed rows over 8 experts.
  const std::vector<int> counts = {2011, 2093, 1987, 2150, 1902, 2071, 2133, 2037};
  const int E = 8, rows = std::accumulate(counts.begin(), counts.end(), 0), H = 2048;
  struct Mat {
    const char* name;
    int K, N;  // x [rows, K] -> y [rows, N], weight [N, K] per expert
  };
  for (const Mat m : {Mat{"fc1", H, 4096}, Mat{"fc2", 2048, H}}) {
    const int K = m.K, N = m.N;
    auto* x = dev<__nv_bfloat16>((size_t)rows * K);
    auto* y = dev<__nv_bfloat16>((size_t)rows * N);
    auto* w = dev<__nv_bfloat16>((size_t)E * N * K);
    auto* dw = dev<float>((size_t)E * N * K);
    auto* dwb = dev<__nv_bfloat16>((size_t)E * N * K);
    std::vector<int> off(E + 1, 0);
    for (int e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
    const double fl = 2.0 * rows * N * K;

    // forward: col-major Y(N x M) = W^T (N x K) * X (K x M)
    auto fwd_loop = [&] {
      for (int e = 0; e < E; ++e)
        lt_gemm(CUBLAS_OP_T, CUBLAS_OP_N, N, counts[e], K, w + (size_t)e * N * K, K, x + (size_t)off[e] * K, K,
                y + (size_t)off[e] * N, N, CUDA_R_16BF, 0.f);
    };
    // dgrad: dX(K x M) = W (K x N) * dY (N x M)   (reuse x as dX, y as dY)
    auto dgrad_loop = [&] {
      for (int e = 0; e < E; ++e)
        lt_gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, counts[e], N, w + (size_t)e * N * K, K, y + (size_t)off[e] * N, N,
                x + (size_t)off[e] * K, K, CUDA_R_16BF, 0.f);
    };
    // wgrad: dW(K x N) += X (K x M) * dY^T (M x N), fp32
    auto wgrad_loop = [&] {
      for (int e = 0; e < E; ++e)
        lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, counts[e], x + (size_t)off[e] * K, K, y + (size_t)off[e] * N, N,
                dw + (size_t)e * N * K, K, CUDA_R_32F, 1.f);
    };
    report(m.name, "fwd", "loop", median_ms(fwd_loop), fl);
    report(m.name, "dgrad", "loop", median_ms(dgrad_loop), fl);
    report(m.name, "wgrad_fp32", "loop", median_ms(wgrad_loop), fl);

    // Dense ceiling: one GEMM over all rows (one weight).
    report(m.name, "fwd", "dense",
           median_ms([&] { lt_gemm(CUBLAS_OP_T, CUBLAS_OP_N, N, rows, K, w, K, x, K, y, N, CUDA_R_16BF, 0.f); }), fl);
    report(m.name, "dgrad", "dense",
           median_ms([&] { lt_gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, rows, N, w, K, y, N, x, K, CUDA_R_16BF, 0.f); }), fl);
    // The same wgrad FLOPs as 8 GEMMs of K = rows / 8 into one fp32 output of E x size (= the loop
    // with every expert's count equal to 2048): the loop's cost at balanced, aligned counts.
    auto wgrad_even = [&] {
      for (int e = 0; e < E; ++e)
        lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, rows / E, x + (size_t)e * (rows / E) * K, K,
                y + (size_t)e * (rows / E) * N, N, dw + (size_t)e * N * K, K, CUDA_R_32F, 1.f);
    };
    report(m.name, "wgrad_fp32", "loop_even_counts", median_ms(wgrad_even), fl);
    auto wgrad_bf16 = [&] {
      for (int e = 0; e < E; ++e)
        lt_gemm(CUBLAS_OP_N, CUBLAS_OP_T, K, N, counts[e], x + (size_t)off[e] * K, K, y + (size_t)off[e] * N, N,
                dwb + (size_t)e * N * K, K, CUDA_R_16BF, 0.f);
    };
    report(m.name, "wgrad_bf16_out", "loop", median_ms(wgrad_bf16), fl);

    // Grouped: E groups of one problem each.
    std::vector<cublasOperation_t> ta(E), tb(E);
    std::vector<int> ms(E), ns(E), ks(E), lda(E), ldb(E), ldc(E), gs(E, 1);
    std::vector<float> alpha(E, 1.f), beta0(E, 0.f), beta1(E, 1.f);
    std::vector<const void*> hA(E), hB(E);
    std::vector<void*> hC(E);
    const void** dA = dev<const void*>(E);
    const void** dB = dev<const void*>(E);
    void** dC = dev<void*>(E);
    auto grouped = [&](const char* pass, cublasOperation_t a_op, cublasOperation_t b_op, cudaDataType_t ct,
                       const std::function<void(int)>& fill, bool accumulate) {
      for (int e = 0; e < E; ++e) {
        ta[e] = a_op;
        tb[e] = b_op;
        fill(e);
      }
      cudaMemcpy(dA, hA.data(), E * sizeof(void*), cudaMemcpyHostToDevice);
      cudaMemcpy(dB, hB.data(), E * sizeof(void*), cudaMemcpyHostToDevice);
      cudaMemcpy(dC, hC.data(), E * sizeof(void*), cudaMemcpyHostToDevice);
      auto run = [&] {
        cublasStatus_t st = cublasGemmGroupedBatchedEx(blas, ta.data(), tb.data(), ms.data(), ns.data(), ks.data(),
                                                       alpha.data(), dA,
                                                       CUDA_R_16BF, lda.data(), dB, CUDA_R_16BF, ldb.data(),
                                                       accumulate ? beta1.data() : beta0.data(), dC, ct, ldc.data(), E,
                                                       gs.data(), CUBLAS_COMPUTE_32F);
        if (st != CUBLAS_STATUS_SUCCESS) {
          std::printf("{\"probe\":\"moe-expert-gemm\",\"matrix\":\"%s\",\"pass\":\"%s\",\"variant\":\"grouped\",\"error\":%d}\n",
                      m.name, pass, (int)st);
          return false;
        }
        return true;
      };
      if (!run()) return;
      report(m.name, pass, "grouped", median_ms([&] { run(); }), fl);
    };
    grouped("fwd", CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF,
            [&](int e) {
              ms[e] = N, ns[e] = counts[e], ks[e] = K, lda[e] = K, ldb[e] = K, ldc[e] = N;
              hA[e] = w + (size_t)e * N * K, hB[e] = x + (size_t)off[e] * K, hC[e] = y + (size_t)off[e] * N;
            },
            false);
    grouped("dgrad", CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_16BF,
            [&](int e) {
              ms[e] = K, ns[e] = counts[e], ks[e] = N, lda[e] = K, ldb[e] = N, ldc[e] = K;
              hA[e] = w + (size_t)e * N * K, hB[e] = y + (size_t)off[e] * N, hC[e] = x + (size_t)off[e] * K;
            },
            false);
    grouped("wgrad_fp32", CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F,
            [&](int e) {
              ms[e] = K, ns[e] = N, ks[e] = counts[e], lda[e] = K, ldb[e] = N, ldc[e] = K;
              hA[e] = x + (size_t)off[e] * K, hB[e] = y + (size_t)off[e] * N, hC[e] = dw + (size_t)e * N * K;
            },
            true);
    cudaFree(x), cudaFree(y), cudaFree(w), cudaFree(dw), cudaFree(dwb);
  }
  return 0;
}
