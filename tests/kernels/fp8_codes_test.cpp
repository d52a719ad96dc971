// The ops on ready-made FP8 codes (--fp8-param-gather's gathered weights): reading codes back
// with a scale_inv gives exactly fp8_fake_quantize's values for that scale (the emulated GEMMs
// see the same weight either way), on the CPU and on the GPU; the transpose is a transpose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "kernels/fp8_codes.h"
#include "kernels/ops.h"
#include "support/gpu.h"

namespace mt {
namespace {

// Every code of the format, and values that cast to them under `scale`.
std::vector<float> values(Fp8Format f, float scale) {
  std::vector<float> v;
  for (int c = 0; c < 256; ++c) {
    const float d = fp8_decode(static_cast<uint8_t>(c), f);
    if (d == d) v.push_back(d / scale);  // NaN codes aside: a weight is finite
  }
  return v;
}

Tensor codes_of(const Tensor& x, const Tensor& scale, Fp8Format f) {
  Tensor q = Tensor::zeros({1, x.numel()}, DType::U8, x.device()), amax = Tensor::zeros({1}, DType::F32, x.device()),
         sat = Tensor::zeros({1}, DType::I64, x.device());
  ops::fp8_cast_transpose(x.view({1, x.numel()}), scale, f, q, nullptr, amax, sat);
  return q;
}

TEST(Fp8Codes, DequantizeIsTheFakeQuantization) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (float s : {1.f, 3.f, 0.0137f, 4096.f}) {
      const std::vector<float> v = values(f, s);
      const Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
      const Tensor scale = Tensor::from_vector(std::vector<float>{s}, {1});
      Tensor used = Tensor::zeros({1}), inv = Tensor::zeros({1}), sat = Tensor::zeros({1}, DType::I64);
      ops::fp8_snapshot_scale(scale, used, inv);
      const Tensor got = ops::fp8_dequantize(codes_of(x, scale, f), inv, f, DType::F32);
      EXPECT_EQ(got.to_vector(), ops::fp8_fake_quantize(x, scale, f, sat).to_vector()) << "scale " << s;
    }
}

TEST(Fp8Codes, TransposeCodes) {
  Tensor q = Tensor::zeros({37, 53}, DType::U8), qt = Tensor::zeros({53, 37}, DType::U8);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 3);
  ops::fp8_transpose_codes(q, qt);
  for (int64_t r = 0; r < 37; ++r)
    for (int64_t c = 0; c < 53; ++c) ASSERT_EQ(qt.data<uint8_t>()[c * 37 + r], q.data<uint8_t>()[r * 53 + c]);
}

// The GPU's read-back (bf16 and f32) and transpose against the CPU's, on every code.
TEST(Fp8CodesGpu, MatchTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    std::vector<uint8_t> all(256);
    for (int c = 0; c < 256; ++c) all[static_cast<size_t>(c)] = static_cast<uint8_t>(c);
    Tensor q = Tensor::zeros({16, 16}, DType::U8);
    std::copy(all.begin(), all.end(), q.data<uint8_t>());
    const Tensor inv = Tensor::from_vector(std::vector<float>{1.f / 3.f}, {1});
    const std::vector<float> want = ops::fp8_dequantize(q, inv, f, DType::F32).to_vector();
    const Tensor qd = q.to_device(Device::CUDA), invd = inv.to_device(Device::CUDA);
    const std::vector<float> f32 = ops::fp8_dequantize(qd, invd, f, DType::F32).to_device(Device::CPU).to_vector();
    const std::vector<float> bf =
        ops::fp8_dequantize(qd, invd, f, DType::BF16).to_device(Device::CPU).to(DType::F32).to_vector();
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i] != want[i]) {  // NaN codes stay NaN
        EXPECT_NE(f32[i], f32[i]);
        continue;
      }
      EXPECT_EQ(f32[i], want[i]) << "code " << i;
      EXPECT_EQ(bf[i], round_bf16(want[i])) << "code " << i;
    }
  }
  Tensor q = Tensor::zeros({37, 53}, DType::U8), qt = Tensor::zeros({53, 37}, DType::U8);
  for (int64_t i = 0; i < q.numel(); ++i) q.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 3);
  ops::fp8_transpose_codes(q, qt);
  Tensor qtd = Tensor::zeros({53, 37}, DType::U8, Device::CUDA);
  ops::fp8_transpose_codes(q.to_device(Device::CUDA), qtd);
  const Tensor got = qtd.to_device(Device::CPU);
  EXPECT_EQ(std::vector<uint8_t>(got.data<uint8_t>(), got.data<uint8_t>() + got.numel()),
            std::vector<uint8_t>(qt.data<uint8_t>(), qt.data<uint8_t>() + qt.numel()));
}

}  // namespace
}  // namespace mt
