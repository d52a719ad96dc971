// The FP8 ops' update rules on the CPU against values worked out by hand (Transformer Engine's
// DelayedScaling / Float8CurrentScaling / Float8BlockScaling rules, ops.def).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <vector>

#include "kernels/ops.h"

namespace mt::ops {
namespace {

constexpr float kE4 = 448.f;

Tensor vec(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::from_vector(v, {n});
}
float scalar(const Tensor& t) { return t.to_vector()[0]; }

struct Delayed {
  Tensor history, scale = vec({1.f});
  explicit Delayed(int64_t L) : history(Tensor::zeros({L})) {}
  float update(float amax, bool use_max, int margin = 0) {
    fp8_delayed_update(history, scale, vec({amax}), kE4, margin, use_max);
    return scalar(scale);
  }
};

TEST(Fp8Ops, AmaxIgnoresNaNAndKeepsInf) {
  Tensor a = vec({0.f});
  fp8_amax(vec({-3.f, 2.f, NAN, 1.f}), a);
  EXPECT_EQ(scalar(a), 3.f);
  fp8_amax(vec({1.f, -INFINITY}), a);
  EXPECT_EQ(scalar(a), INFINITY);
  fp8_amax(Tensor::zeros({0}), a);
  EXPECT_EQ(scalar(a), 0.f);
}

TEST(Fp8Ops, DelayedMostRecentUsesTheNewestAmax) {
  Delayed d(3);
  EXPECT_EQ(d.update(2.f, false), 224.f);  // 448 / 2
  EXPECT_EQ(d.history.to_vector(), (std::vector<float>{0, 0, 2}));
  EXPECT_EQ(d.update(8.f, false), 56.f);
  EXPECT_EQ(d.history.to_vector(), (std::vector<float>{0, 2, 8}));
  EXPECT_EQ(d.update(4.f, false), 112.f);  // most_recent: 4, though 8 is in the window
}

TEST(Fp8Ops, DelayedMaxUsesTheWindowOfTheLastLAmaxes) {
  Delayed d(3);
  EXPECT_EQ(d.update(2.f, true), 224.f);
  EXPECT_EQ(d.update(8.f, true), 56.f);
  EXPECT_EQ(d.update(4.f, true), 56.f);  // window {2, 8, 4}
  EXPECT_EQ(d.history.to_vector(), (std::vector<float>{0, 8, 4}));
  EXPECT_EQ(d.update(1.f, true), 56.f);   // window {8, 4, 1}
  EXPECT_EQ(d.update(1.f, true), 112.f);  // window {4, 1, 1}: the 8 has left
  EXPECT_EQ(d.history.to_vector(), (std::vector<float>{0, 1, 1}));
}

TEST(Fp8Ops, DelayedMarginAndDegenerateAmaxes) {
  Delayed d(1);
  EXPECT_EQ(d.update(2.f, false, 1), 112.f);  // 448 / 2 / 2^1
  EXPECT_EQ(d.update(0.f, false), 112.f);     // amax 0: the old scale is kept
  EXPECT_EQ(d.update(INFINITY, false), 112.f);
  EXPECT_EQ(d.update(NAN, false), 112.f);
  EXPECT_EQ(d.update(1e-45f, false), FLT_MAX);  // 448 / 1e-45 overflows fp32
  EXPECT_EQ(d.history.to_vector(), (std::vector<float>{0}));
}

TEST(Fp8Ops, CurrentScalingUsesThisAmaxOrOne) {
  Tensor s = vec({5.f});
  fp8_current_scale(vec({2.f}), s, kE4);
  EXPECT_EQ(scalar(s), 224.f);
  fp8_current_scale(vec({0.f}), s, kE4);
  EXPECT_EQ(scalar(s), 1.f);
  fp8_current_scale(vec({INFINITY}), s, 57344.f);
  EXPECT_EQ(scalar(s), 1.f);
  fp8_current_scale(vec({7.f}), s, 57344.f);
  EXPECT_EQ(scalar(s), 8192.f);
}

TEST(Fp8Ops, FakeQuantizeRoundsScalesBackAndCountsClipped) {
  Tensor sat = Tensor::zeros({1}, DType::I64);
  const Tensor y = fp8_fake_quantize(vec({2.f, 1.f, 0.01f, -5.f, 0.f}), vec({224.f}), Fp8Format::E4M3, sat);
  // 2.24 lies on E4M3's grid of spacing 1/4 in [2, 4) next to 2.25; -1120 saturates to -448.
  const std::vector<float> want = {2.f, 1.f, 2.25f * (1.f / 224.f), -2.f, 0.f};
  EXPECT_EQ(y.to_vector(), want);
  EXPECT_EQ(*sat.data<int64_t>(), 1);
  fp8_fake_quantize(vec({-5.f, 5.f, 2.f}), vec({224.f}), Fp8Format::E4M3, sat);
  EXPECT_EQ(*sat.data<int64_t>(), 3);  // accumulates; 448 itself is not clipped
  // E5M2 at scale 1: 3.3 -> 3.5 (spacing 1/2 in [2, 4)), 1e5 -> 57344 (clipped).
  const Tensor z = fp8_fake_quantize(vec({3.3f, 1e5f}), vec({1.f}), Fp8Format::E5M2, sat);
  EXPECT_EQ(z.to_vector(), (std::vector<float>{3.5f, 57344.f}));
  EXPECT_EQ(*sat.data<int64_t>(), 4);
}

TEST(Fp8Ops, BlockwiseScalesArePowersOfTwoPerTile) {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, -3, 0.5f, 0, 0, 100}, {2, 3});
  Tensor scales = Tensor::zeros({4});
  const Tensor y = fp8_fake_quantize_blocks(x, Fp8Format::E4M3, 1, 2, scales);
  // Tiles [1, -3] [0.5] / [0, 0] [100]: 448/3 -> 128, 448/0.5 -> 512, none -> 1, 4.48 -> 4.
  EXPECT_EQ(scales.to_vector(), (std::vector<float>{128, 512, 1, 4}));
  // 100 * 4 = 400 ties between 384 and 416 on E4M3's grid (spacing 32): 384, so 96.
  EXPECT_EQ(y.to_vector(), (std::vector<float>{1, -3, 0.5f, 0, 0, 96}));
  // 128 x 128 blocks of a [130, 3] tensor: two blocks, the second one row.
  std::vector<float> v(130 * 3, 0.25f);
  v[129 * 3 + 1] = 7.f;
  Tensor s2 = Tensor::zeros({2});
  fp8_fake_quantize_blocks(Tensor::from_vector(v, {130, 3}), Fp8Format::E4M3, 128, 128, s2);
  EXPECT_EQ(s2.to_vector(), (std::vector<float>{1024, 64}));  // 448/0.25 = 1792 -> 1024; 448/7 = 64
}

}  // namespace
}  // namespace mt::ops
