// Linear layer on OpenBLAS. y = x @ w^T with Megatron's [out, in] weight layout, so every
// product is a gemm with a transpose flag and no copies.
//
// Thread-count invariance: how OpenBLAS splits a gemm across its threads changes which
// micro-kernel (main or edge, each with its own summation order on some kernel families, e.g.
// OPENBLAS_CORETYPE=Haswell or Zen) computes a given output element, and for k between GEMM_Q
// and 2 GEMM_Q its single- and multi-threaded drivers also split the reduction differently. So
// we control the split ourselves: the output is cut into fixed tiles of kTileM x kTileN, our
// OpenMP threads share the tiles, and each tile is one single-threaded OpenBLAS call per
// reduction chunk of kKChunk (below any GEMM_Q), accumulated in order. Every element's arithmetic
// then depends only on the shapes, never on the thread count or the CPU's core count.
#include <algorithm>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

using blas::kKChunk;
constexpr int64_t kTileM = 256, kTileN = 256;

// C[m,n] = op(A) @ op(B) + beta * C, tile by tile, each tile's k-reduction chunk by chunk (see
// above). op(A) is [m,k] (A stored [k,m] when ta); op(B) is [k,n] (B stored [n,k] when tb).
template <typename T>
void gemm_fixed_k(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
                  int64_t ldb, T beta, T* c, int64_t ldc) {
  blas::single_threaded();
  const int64_t tiles_m = (m + kTileM - 1) / kTileM, tiles_n = (n + kTileN - 1) / kTileN;
  const int64_t tiles = tiles_m * tiles_n;
#pragma omp parallel for schedule(dynamic, 1) if (tiles > 1 && m * n * k > (1 << 18))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = (t / tiles_n) * kTileM, j0 = (t % tiles_n) * kTileN;
    const int64_t mm = std::min(kTileM, m - i0), nn = std::min(kTileN, n - j0);
    const T* at = ta ? a + i0 : a + i0 * lda;
    const T* bt = tb ? b + j0 * ldb : b + j0;
    blas::gemm_chunked_k(ta, tb, mm, nn, k, at, lda, bt, ldb, beta, c + i0 * ldc + j0, ldc);
  }
}

template <typename T>
void linear_forward_impl(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
  if (M == 0 || N == 0) return;
  // The bias is written first and the gemm accumulates onto it (beta = 1): no second pass.
  if (b) {
#pragma omp parallel for schedule(static) if (M * N > 65536)
    for (int64_t r = 0; r < M; ++r) std::copy(b, b + N, y + r * N);
  }
  if (K == 0) {
    if (!b) std::fill(y, y + M * N, T(0));
    return;
  }
  gemm_fixed_k(false, true, M, N, K, x, K, w, K, b ? T(1) : T(0), y, N);
}

// db[N] += column sums of dy[M,N]. Threads split the columns, and each column is summed over
// rows in increasing order, so the result does not depend on the thread count.
template <typename T>
void column_sum_add(const T* dy, T* db, int64_t M, int64_t N) {
  constexpr int64_t kBlock = 256;
  const int64_t nblocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (M * N > 65536)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = std::min(N, j0 + kBlock);
    T acc[kBlock] = {};
    for (int64_t r = 0; r < M; ++r) {
      const T* row = dy + r * N;
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
    }
    for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
  }
}

template <typename T>
void linear_backward_impl(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t M, int64_t N,
                          int64_t K) {
  if (dx && M > 0 && K > 0) {
    if (N == 0)
      std::fill(dx, dx + M * K, T(0));
    else
      gemm_fixed_k(false, false, M, K, N, dy, N, w, K, T(0), dx, K);
  }
  if (M == 0 || N == 0) return;
  if (dw && K > 0) gemm_fixed_k(true, false, N, K, M, dy, N, x, K, T(1), dw, K);
  if (db) column_sum_add(dy, db, M, N);
}

}  // namespace

void linear_forward(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K) {
  linear_forward_impl(x, w, b, y, M, N, K);
}
void linear_forward(const double* x, const double* w, const double* b, double* y, int64_t M, int64_t N, int64_t K) {
  linear_forward_impl(x, w, b, y, M, N, K);
}
void linear_backward(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db, int64_t M,
                     int64_t N, int64_t K) {
  linear_backward_impl(dy, x, w, dx, dw, db, M, N, K);
}
void linear_backward(const double* dy, const double* x, const double* w, double* dx, double* dw, double* db,
                     int64_t M, int64_t N, int64_t K) {
  linear_backward_impl(dy, x, w, dx, dw, db, M, N, K);
}

}  // namespace mt::cpu
