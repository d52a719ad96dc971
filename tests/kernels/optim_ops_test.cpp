// The optimizer ops on the CPU (ops.def, "Optimizer side"): the gradient norm (reproducible for
// any thread count), Megatron's clipping rule, the fp16 unscale-and-check, and the AdamW and SGD
// updates with the compute copy they write in the same pass. The updates' arithmetic against the
// published formulas is tested in tests/optim; the GPU versions against these in
// backend_ops_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt::ops {
namespace {

Tensor vec(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }
FlatRanges whole(int64_t n) { return {{0, n}}; }
const float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();

TEST(OptimOps, GradNormSmallVectorExact) {
  const Tensor g = vec({3.0f, -4.0f, 0.0f});
  EXPECT_EQ(grad_norm_squared(g, whole(3)), 25.0);
  EXPECT_EQ(grad_norm_squared(g, {{0, 0}}), 0.0);
}

TEST(OptimOps, GradNormIdenticalForOneAndTwoThreads) {
  const int64_t n = 1 << 20;
  std::vector<float> g(n);
  long double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Values spanning several orders of magnitude make summation order visible in the bits.
    g[i] = std::sin(0.7f * static_cast<float>(i)) * std::pow(10.0f, static_cast<float>(i % 7) - 3.0f);
    ref += static_cast<long double>(g[i]) * g[i];
  }
  const Tensor t = vec(g);
  double one = 0, two = 0;
  test::with_threads(1, [&] { one = grad_norm_squared(t, whole(n)); });
  test::with_threads(2, [&] { two = grad_norm_squared(t, whole(n)); });
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, static_cast<double>(ref), 1e-12 * static_cast<double>(ref));
}

TEST(OptimOps, GradNormNonFinitePropagates) {
  std::vector<float> g(100, 1.0f);
  g[37] = kInf;
  EXPECT_TRUE(std::isinf(grad_norm_squared(vec(g), whole(100))));
  g[37] = kNan;
  EXPECT_TRUE(std::isnan(grad_norm_squared(vec(g), whole(100))));
}

TEST(OptimOps, ClipScalesByMaxNormOverNormPlusEps) {
  Tensor g = vec({3.0f, -4.0f});
  const double norm = std::sqrt(grad_norm_squared(g, whole(2)));  // 5
  clip_grads(g, whole(2), norm, 1.0);
  const double coeff = 1.0 / (5.0 + 1e-6);
  EXPECT_EQ(g.data<float>()[0], 3.0f * static_cast<float>(coeff));  // the fp32 product with the rounded coefficient
  EXPECT_EQ(g.data<float>()[1], -4.0f * static_cast<float>(coeff));
  EXPECT_NEAR(std::sqrt(grad_norm_squared(g, whole(2))), 1.0, 1e-6);
}

TEST(OptimOps, ClipLeavesGradsAloneWhenCoeffNotBelowOneAndOutsideTheRanges) {
  const std::vector<float> orig = {0.3f, -0.4f, 8.0f, 9.0f};
  Tensor g = vec(orig);
  clip_grads(g, whole(4), 0.5, 1.0);
  EXPECT_EQ(g.to_vector(), orig);
  clip_grads(g, whole(4), kNan, 1.0);  // Megatron's "if clip_coeff < 1.0": a NaN norm never clips
  EXPECT_EQ(g.to_vector(), orig);
  // Exactly at the boundary: coeff = max/(norm+1e-6) < 1, so Megatron does clip (slightly).
  clip_grads(g, {{0, 1}, {3, 4}}, 1.0, 1.0);
  const std::vector<float> got = g.to_vector();
  EXPECT_LT(got[0], orig[0]);
  EXPECT_EQ(got[1], orig[1]);
  EXPECT_EQ(got[2], orig[2]);
  EXPECT_LT(got[3], orig[3]);
}

TEST(OptimOps, UnscaleAndCheckScalesAndFlagsNonFinite) {
  Tensor g = vec({1024.0f, -512.0f, 0.0f});
  EXPECT_FALSE(unscale_and_check(g, whole(3), 1.0f / 1024.0f));
  EXPECT_EQ(g.to_vector(), (std::vector<float>{1.0f, -0.5f, 0.0f}));
  Tensor inf = vec({1.0f, kInf, 2.0f});
  EXPECT_TRUE(unscale_and_check(inf, whole(3), 0.5f));
  Tensor nan = vec({1.0f, kNan});
  EXPECT_TRUE(unscale_and_check(nan, whole(2), 0.5f));
  std::vector<float> big(100000, 1.0f);
  big[99999] = std::numeric_limits<float>::max();
  Tensor b = vec(big);
  EXPECT_TRUE(unscale_and_check(b, whole(100000), 4.0f));  // overflow from unscaling
}

TEST(OptimOps, UnscaleAndCheckLooksOnlyAtTheRanges) {
  Tensor g = vec({2.0f, kNan, 4.0f, 8.0f});
  EXPECT_FALSE(unscale_and_check(g, {{0, 1}, {2, 4}}, 0.5f));  // the NaN lies outside
  const std::vector<float> got = g.to_vector();
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], 2.0f);
  EXPECT_EQ(got[3], 4.0f);
  EXPECT_TRUE(unscale_and_check(g, {{1, 2}}, 0.5f));
}

// One update of a fixed problem, with the given compute copy (or none); returns the params.
struct Update {
  std::vector<float> p0 = test::random_vec<float>(3000, 1), g = test::random_vec<float>(3000, 2, -0.1, 0.1);
  std::vector<DecaySegment> segments = {{0, 1000, true}, {1000, 1700, false}, {1700, 3000, true}};
  float grad_scale = 1.f;
  std::vector<float> adamw(const HalfCopy& copy) const {
    Tensor p = vec(p0), m = Tensor::zeros({3000}), v = Tensor::zeros({3000});
    AdamWStep h;
    h.grad_scale = grad_scale;
    h.lr = 1e-2;
    h.weight_decay = 0.1;
    adamw_step(p, vec(g), m, v, segments, h, copy);
    return p.to_vector();
  }
  std::vector<float> sgd(const HalfCopy& copy) const {
    Tensor p = vec(p0), buf = Tensor::zeros({3000});
    SGDStep h;
    h.grad_scale = grad_scale;
    h.lr = 0.1;
    h.weight_decay = 0.01;
    h.momentum = 0.9;
    h.first = true;
    sgd_step(p, vec(g), &buf, segments, h, copy);
    return p.to_vector();
  }
};

// The copy holds the updated params rounded to the half type: as fp32 values (the CPU's emulated
// copy, what ParamStore::sync_model_from_main would write) or as bf16/fp16 bits; the fp32 update
// is the same with or without it.
TEST(OptimOps, UpdatesWriteTheComputeCopyInTheSamePass) {
  const Update u;
  for (const bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "sgd" : "adamw");
    auto run = [&](const HalfCopy& c) { return sgd ? u.sgd(c) : u.adamw(c); };
    const std::vector<float> plain = run({});
    for (const DType half : {DType::BF16, DType::F16}) {
      auto round = [half](float x) { return half == DType::BF16 ? round_bf16(x) : round_f16(x); };
      const HalfCopy emulated{Tensor::zeros({3000}), half};
      EXPECT_TRUE(test::bit_equal(run(emulated), plain));
      const std::vector<float> e = emulated.out.to_vector();
      const HalfCopy stored{Tensor::zeros({3000}, half), half};
      run(stored);
      const std::vector<float> s = stored.out.to_vector();  // widened from the half bits
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_EQ(e[i], round(plain[i])) << i;
        ASSERT_EQ(s[i], round(plain[i])) << i;
      }
    }
  }
}

// Clipping folded into the update (StepRunner) gives the bits of clip_grads followed by the
// update, and leaves the grads as they were.
TEST(OptimOps, UpdatesWithAGradScaleEqualClippingFirst) {
  for (const bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "sgd" : "adamw");
    Update clipped;
    Tensor g = vec(clipped.g);
    const double norm = 3.7, max_norm = 1.0;
    clip_grads(g, {{0, 3000}}, norm, max_norm);
    clipped.g = g.to_vector();
    Update fused;
    fused.grad_scale = clip_coefficient(norm, max_norm);
    ASSERT_LT(fused.grad_scale, 1.f);
    const std::vector<float> want = sgd ? clipped.sgd({}) : clipped.adamw({});
    const std::vector<float> got = sgd ? fused.sgd({}) : fused.adamw({});
    EXPECT_TRUE(test::bit_equal(got, want));
    EXPECT_FALSE(test::bit_equal(got, sgd ? Update{}.sgd({}) : Update{}.adamw({})));  // it did clip
  }
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.f);
  EXPECT_EQ(clip_coefficient(std::nan(""), 1.0), 1.f);
}

TEST(OptimOps, UpdatesTouchOnlyTheirSegments) {
  Update u;
  u.segments = {{100, 200, true}, {200, 300, false}};
  for (const bool sgd : {false, true}) {
    const std::vector<float> p = sgd ? u.sgd({}) : u.adamw({});
    for (int64_t i = 0; i < 3000; ++i) {
      if (i >= 100 && i < 300)
        EXPECT_NE(p[i], u.p0[i]) << i;
      else
        ASSERT_EQ(p[i], u.p0[i]) << i;
    }
  }
}

}  // namespace
}  // namespace mt::ops
