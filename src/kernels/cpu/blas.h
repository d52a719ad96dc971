#pragma once
// Single-threaded OpenBLAS calls with the project's thread-count-invariant splitting rules
// (cpu/linear.cpp explains them): every call reduces over at most kKChunk elements and runs
// single-threaded, so an element's arithmetic depends only on the shapes of the calls, which the
// callers fix independently of the thread count.
#include <cblas.h>

#include <cstdint>
#include <limits>

#include "core/error.h"

namespace mt::cpu::blas {

constexpr int64_t kKChunk = 128;  // below any OpenBLAS GEMM_Q: one reduction split per call

inline blasint bi(int64_t v) {
  MT_CHECK(v >= 0 && v <= std::numeric_limits<blasint>::max(), "gemm dimension {} does not fit BLAS int", v);
  return static_cast<blasint>(v);
}

// Row-major C[m,n] = alpha * op(A) @ op(B) + beta * C.
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, bi(m), bi(n), bi(k),
              alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
}
inline void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, bi(m), bi(n), bi(k),
              alpha, a, bi(lda), b, bi(ldb), beta, c, bi(ldc));
}

// C[m,n] = op(A) @ op(B) + beta * C on the calling thread, the reduction in kKChunk pieces
// accumulated in order. op(A) is [m,k] (A stored [k,m] when ta); op(B) is [k,n] (B stored [n,k]
// when tb). k = 0 leaves C untouched.
template <typename T>
void gemm_chunked_k(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                    int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t k0 = 0; k0 < k; k0 += kKChunk) {
    const int64_t kk = k - k0 < kKChunk ? k - k0 : kKChunk;
    const T* ak = ta ? a + k0 * lda : a + k0;
    const T* bk = tb ? b + k0 : b + k0 * ldb;
    gemm(ta, tb, m, n, kk, T(1), ak, lda, bk, ldb, k0 == 0 ? beta : T(1), c, ldc);
  }
}

// OpenBLAS runs single-threaded inside our tiles (its pthread pool would otherwise split each
// tile again, by its own thread count). The setting is global: it is made outside the parallel
// regions, so whoever changed it since (a test, an embedding program) cannot undo it.
inline void single_threaded() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

}  // namespace mt::cpu::blas
