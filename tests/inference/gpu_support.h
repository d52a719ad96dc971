#pragma once
// What the inference layer's GPU tests share: the skip when no GPU is visible, and bf16-exact
// random values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/tensor.h"
#include "support/gpu.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

#ifdef MT_HAVE_CUDA
#define MT_REQUIRE_GPU() \
  if (!::mt::test::have_gpu()) GTEST_SKIP() << "no CUDA device visible"; \
  ::mt::test::gpu()
#else
#define MT_REQUIRE_GPU() GTEST_SKIP() << "built without the CUDA backend"
#endif

namespace mt::test {

// Values of a bf16-representable random tensor (CPU f32) in [-1, 1], from a linear congruential
// generator.
inline Tensor random_bf16_values(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape);
  uint32_t x = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.data<float>()[i] = static_cast<float>((x >> 8) % 2001) / 1000.f - 1.f;
  }
  return t.to(DType::BF16).to(DType::F32);
}

// The whole-stack decode kernel's launches so far (ops::decode_layer_stack; 0 in a build without
// CUDA, where the GPU tests skip).
inline int64_t stack_launches() {
#ifdef MT_HAVE_CUDA
  return cuda::decode_stack_launches();
#else
  return 0;
#endif
}

// The largest |a - b| over two CPU f32 tensors of one size.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

}  // namespace mt::test
