// MLP activations: SwiGLU on Megatron's packed [gate | up] fc1 output, and GELU in its exact
// (erf) and tanh forms. Pure elementwise, so any thread split gives identical results.
#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
void swiglu_forward_impl(const T* x, T* y, int64_t rows, int64_t F) {
#pragma omp parallel for schedule(static) if (rows * F > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T *g = x + r * 2 * F, *u = g + F;
    T* yr = y + r * F;
    for (int64_t j = 0; j < F; ++j) yr[j] = g[j] * sigmoid(g[j]) * u[j];
  }
}

// d silu(g)/dg = sig(g) * (1 + g * (1 - sig(g))).
template <typename T>
void swiglu_backward_impl(const T* dy, const T* x, T* dx, int64_t rows, int64_t F) {
#pragma omp parallel for schedule(static) if (rows * F > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T *g = x + r * 2 * F, *u = g + F, *dyr = dy + r * F;
    T *dg = dx + r * 2 * F, *du = dg + F;
    for (int64_t j = 0; j < F; ++j) {
      const T s = sigmoid(g[j]);
      du[j] = dyr[j] * g[j] * s;
      dg[j] = dyr[j] * u[j] * s * (T(1) + g[j] * (T(1) - s));
    }
  }
}

template <typename T>
struct GeluConst {
  static constexpr T kInvSqrt2 = T(0.70710678118654752440);
  static constexpr T kInvSqrt2Pi = T(0.39894228040143267794);
  static constexpr T kSqrt2OverPi = T(0.79788456080286535588);
  static constexpr T kCubic = T(0.044715);
};

template <typename T>
void gelu_forward_impl(const T* x, T* y, int64_t n, bool tanh_approx) {
  using C = GeluConst<T>;
  if (tanh_approx) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      y[i] = T(0.5) * v * (T(1) + std::tanh(C::kSqrt2OverPi * (v + C::kCubic * v * v * v)));
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = T(0.5) * x[i] * (T(1) + std::erf(x[i] * C::kInvSqrt2));
  }
}

template <typename T>
void gelu_backward_impl(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx) {
  using C = GeluConst<T>;
  if (tanh_approx) {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      const T t = std::tanh(C::kSqrt2OverPi * (v + C::kCubic * v * v * v));
      const T dinner = C::kSqrt2OverPi * (T(1) + T(3) * C::kCubic * v * v);
      dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * dinner);
    }
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const T v = x[i];
      const T cdf = T(0.5) * (T(1) + std::erf(v * C::kInvSqrt2));
      const T pdf = C::kInvSqrt2Pi * std::exp(T(-0.5) * v * v);
      dx[i] = dy[i] * (cdf + v * pdf);
    }
  }
}

}  // namespace

void swiglu_forward(const float* x, float* y, int64_t rows, int64_t F) { swiglu_forward_impl(x, y, rows, F); }
void swiglu_forward(const double* x, double* y, int64_t rows, int64_t F) { swiglu_forward_impl(x, y, rows, F); }
void swiglu_backward(const float* dy, const float* x, float* dx, int64_t rows, int64_t F) {
  swiglu_backward_impl(dy, x, dx, rows, F);
}
void swiglu_backward(const double* dy, const double* x, double* dx, int64_t rows, int64_t F) {
  swiglu_backward_impl(dy, x, dx, rows, F);
}
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx) { gelu_forward_impl(x, y, n, tanh_approx); }
void gelu_forward(const double* x, double* y, int64_t n, bool tanh_approx) {
  gelu_forward_impl(x, y, n, tanh_approx);
}
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx) {
  gelu_backward_impl(dy, x, dx, n, tanh_approx);
}
void gelu_backward(const double* dy, const double* x, double* dx, int64_t n, bool tanh_approx) {
  gelu_backward_impl(dy, x, dx, n, tanh_approx);
}

}  // namespace mt::cpu
