// The decode fusions' CPU references (ops.def: fused_linear_forward, qkv_split_to_cache,
// fused_qkv_forward; issue
// #22) against the arithmetic written out here: RMSNorm, the product, SwiGLU and the residual in
// double; the split's index math into the caches. Forward only (inference has no backward), so
// no gradient checks. The GPU's fused kernels are tested against these and against the unfused
// GPU ops in decode_fusions_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "gpu_support.h"
#include "kernels/ops.h"

namespace mt::test {
namespace {

// rows x in -> rows x out (or out / 2 with SwiGLU), in double.
std::vector<double> naive(const Tensor& x, const Tensor& gamma, float eps, const Tensor& w, const Tensor* b,
                          bool swiglu, const Tensor* residual) {
  const int64_t in = w.dim(1), out = w.dim(0), rows = x.numel() / in;
  const float* xp = x.data<float>();
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t k = 0; k < in; ++k) ss += static_cast<double>(xp[r * in + k]) * xp[r * in + k];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(in) + eps);
    for (int64_t n = 0; n < out; ++n) {
      double acc = b ? b->data<float>()[n] : 0.0;
      for (int64_t k = 0; k < in; ++k)
        acc += xp[r * in + k] * rs * gamma.data<float>()[k] * static_cast<double>(w.data<float>()[n * in + k]);
      if (residual) acc += residual->data<float>()[r * out + n];
      y[static_cast<size_t>(r * out + n)] = acc;
    }
  }
  if (!swiglu) return y;
  const int64_t F = out / 2;
  std::vector<double> a(static_cast<size_t>(rows * F));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < F; ++j) {
      const double g = y[static_cast<size_t>(r * out + j)], u = y[static_cast<size_t>(r * out + F + j)];
      a[static_cast<size_t>(r * F + j)] = g / (1.0 + std::exp(-g)) * u;
    }
  return a;
}

double max_diff(const Tensor& got, const std::vector<double>& want) {
  EXPECT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(got.data<float>()[i]) - want[i]));
  return m;
}

TEST(DecodeFusions, FusedLinearIsNormThenProductThenSwigluOrResidual) {
  const int64_t rows = 2, in = 64, out = 96;
  const Tensor x = random_bf16_values({rows, in}, 1), gamma = random_bf16_values({in}, 2);
  const Tensor w = random_bf16_values({out, in}, 3), b = random_bf16_values({out}, 4);
  const Tensor res = random_bf16_values({rows, out}, 5);
  const float eps = 1e-5f;
  // The norm, the bias, the residual, SwiGLU, each alone and together (no residual after SwiGLU).
  EXPECT_LT(max_diff(ops::fused_linear_forward(x, w, nullptr, {&gamma, eps}), naive(x, gamma, eps, w, nullptr, false, nullptr)),
            1e-4);
  EXPECT_LT(max_diff(ops::fused_linear_forward(x, w, &b, {&gamma, eps, false, &res}), naive(x, gamma, eps, w, &b, false, &res)),
            1e-4);
  EXPECT_LT(max_diff(ops::fused_linear_forward(x, w, &b, {&gamma, eps, true}), naive(x, gamma, eps, w, &b, true, nullptr)),
            1e-4);
  const Tensor ones = Tensor::from_vector(std::vector<float>(in, 1.f), {in});
  const Tensor plain = ops::fused_linear_forward(x, w, nullptr, {nullptr, 0.f, true});
  const Tensor want = ops::swiglu_forward(ops::linear_forward(x, w, nullptr));
  EXPECT_EQ(max_abs_diff(plain, want), 0.0);  // without the norm: the product and SwiGLU alone
  EXPECT_THROW(ops::fused_linear_forward(x, w, nullptr, {nullptr, 0.f, true, &res}), Error);
}

// Every q element lands in q [1, G*qpg, N, D], every k and v element in the caches at its row's
// (slot, position); nothing else in the caches changes. Without RoPE against the index math, with
// RoPE against qkv_split's rotation.
TEST(DecodeFusions, QkvSplitToCacheWritesQAndTheCaches) {
  const int64_t G = 2, qpg = 3, D = 8, N = 3, slots = 2, L = 6, per = G * (qpg + 2) * D;
  const Tensor packed = random_bf16_values({N, per}, 7);
  const Tensor slot = Tensor::from_vector(std::vector<int32_t>{1, 0, 1}, {N});
  const Tensor pos = Tensor::from_vector(std::vector<int32_t>{5, 0, 2}, {N});
  Tensor kc = random_bf16_values({slots, G, L, D}, 8), vc = random_bf16_values({slots, G, L, D}, 9);
  const Tensor kc0 = kc.clone(), vc0 = vc.clone();
  const Tensor q = ops::qkv_split_to_cache(packed, kc, vc, slot, pos, G, qpg, D);
  ASSERT_EQ(q.shape(), (Shape{1, G * qpg, N, D}));
  const float* p = packed.data<float>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) {
        const float* row = p + i * per + g * (qpg + 2) * D;
        for (int64_t j = 0; j < qpg; ++j) EXPECT_EQ(q.data<float>()[((g * qpg + j) * N + i) * D + d], row[j * D + d]);
        const int64_t at = ((slot.data<int32_t>()[i] * G + g) * L + pos.data<int32_t>()[i]) * D + d;
        EXPECT_EQ(kc.data<float>()[at], row[qpg * D + d]);
        EXPECT_EQ(vc.data<float>()[at], row[(qpg + 1) * D + d]);
      }
  int64_t changed = 0;
  for (int64_t e = 0; e < kc.numel(); ++e) changed += kc.data<float>()[e] != kc0.data<float>()[e];
  EXPECT_LE(changed, N * G * D);

  // RoPE over the whole head: q and the cached k as qkv_split rotates them.
  const Tensor cs = random_bf16_values({N, D / 2}, 10), sn = random_bf16_values({N, D / 2}, 11);
  const ops::RopeRef rope{&cs, &sn, D};
  Tensor kc2 = kc0.clone(), vc2 = vc0.clone();
  const Tensor q2 = ops::qkv_split_to_cache(packed, kc2, vc2, slot, pos, G, qpg, D, rope);
  Tensor wq, wk, wv;
  ops::qkv_split(packed, wq, wk, wv, N, 1, G, qpg, D, rope);
  Tensor kc3 = kc0.clone(), vc3 = vc0.clone();
  ops::kv_cache_write(kc3, vc3, wk, wv, slot, pos);
  EXPECT_EQ(max_abs_diff(q2, wq), 0.0);
  EXPECT_EQ(max_abs_diff(kc2, kc3), 0.0);
  EXPECT_EQ(max_abs_diff(vc2, vc3), 0.0);
}

// fused_qkv_forward: the norm, the product, the split with RoPE and the cache write, against
// those ops one by one.
TEST(DecodeFusions, FusedQkvIsTheLinearThenTheSplitIntoTheCache) {
  const int64_t G = 2, qpg = 2, D = 8, N = 2, in = 16, slots = 2, L = 5, out = G * (qpg + 2) * D;
  const Tensor x = random_bf16_values({N, in}, 21), gamma = random_bf16_values({in}, 22);
  const Tensor w = random_bf16_values({out, in}, 23), b = random_bf16_values({out}, 24);
  const Tensor slot = Tensor::from_vector(std::vector<int32_t>{1, 0}, {N});
  const Tensor pos = Tensor::from_vector(std::vector<int32_t>{4, 1}, {N});
  const Tensor cs = random_bf16_values({N, D / 2}, 25), sn = random_bf16_values({N, D / 2}, 26);
  const ops::RopeRef rope{&cs, &sn, D};
  const Tensor kc0 = random_bf16_values({slots, G, L, D}, 27), vc0 = random_bf16_values({slots, G, L, D}, 28);
  Tensor kc = kc0.clone(), vc = vc0.clone();
  const Tensor q = ops::fused_qkv_forward(x, w, &b, {&gamma, 1e-5f}, kc, vc, slot, pos, G, qpg, D, rope);
  Tensor rstd, wq, wk, wv, kc2 = kc0.clone(), vc2 = vc0.clone();
  ops::qkv_split(ops::linear_forward(ops::rmsnorm_forward(x, gamma, 1e-5f, rstd), w, &b), wq, wk, wv, N, 1, G, qpg, D,
                 rope);
  ops::kv_cache_write(kc2, vc2, wk, wv, slot, pos);
  EXPECT_EQ(max_abs_diff(q, wq), 0.0);
  EXPECT_EQ(max_abs_diff(kc, kc2), 0.0);
  EXPECT_EQ(max_abs_diff(vc, vc2), 0.0);
}

}  // namespace
}  // namespace mt::test
