#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace mt {
namespace {

TEST(Philox, MatchesPublishedKnownAnswer) {
  // Random123's known-answer test for philox4x32-10 with zero counter and key.
  auto r = Philox::block({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  auto s = Philox::block({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(s[0], 0x408f276du);
  EXPECT_EQ(s[1], 0x41c83b0eu);
  EXPECT_EQ(s[2], 0xa20bc7c6u);
  EXPECT_EQ(s[3], 0x6d5451fdu);
}

TEST(Philox, NormalHasRightMoments) {
  RngState rng{42, 0};
  std::vector<float> v(200000);
  rng.normal(v.data(), static_cast<int64_t>(v.size()), 1.0f, 2.0f);
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= static_cast<double>(v.size());
  for (float x : v) s += (x - m) * (x - m);
  s = std::sqrt(s / static_cast<double>(v.size()));
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(s, 2.0, 0.02);
}

// A slice of the stream (odd start, odd length, across the 64k parallel chunks) is exactly the
// same draws as the whole stream: TP ranks initialise their shards without drawing the rest.
TEST(Philox, NormalSliceEqualsTheWholeStreamsDraws) {
  RngState rng{7, 100};
  std::vector<float> all(200001);
  rng.normal(all.data(), static_cast<int64_t>(all.size()), 0.5f, 3.0f);
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 5}, {1, 1}, {3, 70000}, {65535, 131073}, {199999, 2}}) {
    std::vector<float> part(static_cast<size_t>(n));
    RngState{7, 0}.normal_slice(100, first, n, part.data(), 0.5f, 3.0f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part[static_cast<size_t>(i)], all[static_cast<size_t>(first + i)]) << first << "+" << i;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(round_bf16(std::numeric_limits<float>::infinity())));
}

TEST(DType, F16RoundTripAndSpecials) {
  for (float x : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f}) EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(dtype_from_name("bf16"), DType::BF16);
  EXPECT_THROW(dtype_from_name("float8"), Error);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {3, 2});
  Tensor row = t.slice(1, 1);
  EXPECT_EQ(row.shape(), (Shape{1, 2}));
  row.data<float>()[0] = 10;
  EXPECT_EQ(t.data<float>()[2], 10);
  Tensor v = t.view({-1});
  EXPECT_EQ(v.shape(), (Shape{6}));
  Tensor r = t.flat_range(3, {3});
  EXPECT_EQ(r.to_vector(), (std::vector<float>{3, 4, 5}));
  EXPECT_THROW(t.view({4, 2}), Error);
  EXPECT_THROW(t.slice(2, 2), Error);
}

TEST(Tensor, DtypeConversions) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.5f, -2.f, 3.f}, {3});
  EXPECT_EQ(t.to(DType::BF16).to(DType::F32).to_vector(), t.to_vector());
  EXPECT_EQ(t.to(DType::F16).to_vector(), t.to_vector());
  Tensor i = Tensor::from_vector(std::vector<int32_t>{7, 70000, -1}, {3});
  Tensor l = i.to(DType::I64);
  EXPECT_EQ(l.data<int64_t>()[1], 70000);
  EXPECT_EQ(l.data<int64_t>()[2], -1);
  Tensor z = Tensor::zeros({4}, DType::U16);
  EXPECT_EQ(z.data<uint16_t>()[3], 0);
  Tensor c = t.clone();
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.data<float>()[0], 1.5f);
}

}  // namespace
}  // namespace mt
