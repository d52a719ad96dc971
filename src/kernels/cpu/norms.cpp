// RMSNorm and LayerNorm. Row statistics are accumulated in double (cheap next to the memory
// traffic, and it keeps fp32 results close to the fp64 reference). Rows are independent, so
// forward and dx split rows across threads; dw/db are sums over rows, which threads split by
// column block instead, each column summed over rows in increasing order: the result does
// not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

constexpr int64_t kColBlock = 256;

// For each column j: out[j] += sum over rows r (in order) of f(r, j). f is inlined per block.
template <typename T, typename F>
void column_reduce_add(T* out, int64_t rows, int64_t dim, F f) {
  const int64_t nblocks = (dim + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kColBlock, n = std::min(dim, j0 + kColBlock) - j0;
    double acc[kColBlock] = {};
    for (int64_t r = 0; r < rows; ++r) f(r, j0, n, acc);
    for (int64_t j = 0; j < n; ++j) out[j0 + j] += static_cast<T>(acc[j]);
  }
}

template <typename T>
void rmsnorm_forward_impl(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    rstd[r] = rs;
    T* yr = y + r * dim;
    for (int64_t j = 0; j < dim; ++j) yr[j] = xr[j] * rs * w[j];
  }
}

// With xh = x * rstd and g = dy * w: dx = rstd * (g - xh * mean(g * xh)); dw += sum_rows dy * xh.
template <typename T>
void rmsnorm_backward_impl(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows,
                           int64_t dim) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * dim, *dyr = dy + r * dim;
      const T rs = rstd[r];
      double dot = 0;
      for (int64_t j = 0; j < dim; ++j) dot += static_cast<double>(dyr[j] * w[j]) * (xr[j] * rs);
      const T c = static_cast<T>(dot / static_cast<double>(dim));
      T* dxr = dx + r * dim;
      for (int64_t j = 0; j < dim; ++j) dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * c);
    }
  }
  if (dw) {
    column_reduce_add(dw, rows, dim, [&](int64_t r, int64_t j0, int64_t n, double* acc) {
      const T *xr = x + r * dim + j0, *dyr = dy + r * dim + j0;
      const T rs = rstd[r];
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(dyr[j] * (xr[j] * rs));
    });
  }
}

template <typename T>
void layernorm_forward_impl(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int64_t rows, int64_t dim,
                            double eps) {
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    // Two passes (mean, then centred squares): no cancellation for rows with a large mean.
    double s = 0;
    for (int64_t j = 0; j < dim; ++j) s += xr[j];
    const double mu = s / static_cast<double>(dim);
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
    const T m = static_cast<T>(mu);
    const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    mean[r] = m;
    rstd[r] = rs;
    T* yr = y + r * dim;
    for (int64_t j = 0; j < dim; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
  }
}

// With xh = (x - mean) * rstd and g = dy * w: dx = rstd * (g - mean(g) - xh * mean(g * xh)).
template <typename T>
void layernorm_backward_impl(const T* dy, const T* x, const T* w, const T* mean, const T* rstd, T* dx, T* dw, T* db,
                             int64_t rows, int64_t dim) {
  if (dx) {
#pragma omp parallel for schedule(static) if (rows * dim > 32768)
    for (int64_t r = 0; r < rows; ++r) {
      const T *xr = x + r * dim, *dyr = dy + r * dim;
      const T m = mean[r], rs = rstd[r];
      double sg = 0, sgx = 0;
      for (int64_t j = 0; j < dim; ++j) {
        const double g = dyr[j] * w[j];
        sg += g;
        sgx += g * ((xr[j] - m) * rs);
      }
      const T c1 = static_cast<T>(sg / static_cast<double>(dim)), c2 = static_cast<T>(sgx / static_cast<double>(dim));
      T* dxr = dx + r * dim;
      for (int64_t j = 0; j < dim; ++j) dxr[j] = rs * (dyr[j] * w[j] - c1 - (xr[j] - m) * rs * c2);
    }
  }
  if (dw) {
    column_reduce_add(dw, rows, dim, [&](int64_t r, int64_t j0, int64_t n, double* acc) {
      const T *xr = x + r * dim + j0, *dyr = dy + r * dim + j0;
      const T m = mean[r], rs = rstd[r];
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(dyr[j] * ((xr[j] - m) * rs));
    });
  }
  if (db) {
    column_reduce_add(db, rows, dim, [&](int64_t r, int64_t j0, int64_t n, double* acc) {
      const T* dyr = dy + r * dim + j0;
      for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(dyr[j]);
    });
  }
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t dim, float eps) {
  rmsnorm_forward_impl(x, w, y, rstd, rows, dim, eps);
}
void rmsnorm_forward(const double* x, const double* w, double* y, double* rstd, int64_t rows, int64_t dim,
                     double eps) {
  rmsnorm_forward_impl(x, w, y, rstd, rows, dim, eps);
}
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, float* dw,
                      int64_t rows, int64_t dim) {
  rmsnorm_backward_impl(dy, x, w, rstd, dx, dw, rows, dim);
}
void rmsnorm_backward(const double* dy, const double* x, const double* w, const double* rstd, double* dx, double* dw,
                      int64_t rows, int64_t dim) {
  rmsnorm_backward_impl(dy, x, w, rstd, dx, dw, rows, dim);
}
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                       int64_t rows, int64_t dim, float eps) {
  layernorm_forward_impl(x, w, b, y, mean, rstd, rows, dim, eps);
}
void layernorm_forward(const double* x, const double* w, const double* b, double* y, double* mean, double* rstd,
                       int64_t rows, int64_t dim, double eps) {
  layernorm_forward_impl(x, w, b, y, mean, rstd, rows, dim, eps);
}
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean, const float* rstd,
                        float* dx, float* dw, float* db, int64_t rows, int64_t dim) {
  layernorm_backward_impl(dy, x, w, mean, rstd, dx, dw, db, rows, dim);
}
void layernorm_backward(const double* dy, const double* x, const double* w, const double* mean, const double* rstd,
                        double* dx, double* dw, double* db, int64_t rows, int64_t dim) {
  layernorm_backward_impl(dy, x, w, mean, rstd, dx, dw, db, rows, dim);
}

}  // namespace mt::cpu
