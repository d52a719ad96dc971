// Autotuning of the FP8 GEMMs (kernels/cuda/fp8_lt.h, lt_tune.h): with tuning on, every FP8 GEMM
// of a linear layer (the forward with fast accumulation and a residual C, the E5M2 x E4M3 data
// gradient, the fp32 weight gradient accumulated in place twice) gives the bits it gives with
// tuning off, which runs the heuristic's first choice and nothing else; and the block-scaled GEMMs
// likewise. Shapes are this file's own, so that no other test has tuned their plans before.
#ifdef MT_HAVE_CUDA

#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "kernels/cuda/fp8_lt.h"
#include "kernels/cuda/lt_tune.h"
#include "kernels/fp8_blocks.h"
#include "kernels/ops.h"
#include "support/gpu.h"

namespace mt::ops {
namespace {

using gpu::fp8_gemm_tune_stats;
using gpu::Fp8TuneStats;
using gpu::set_fp8_gemm_tuning;

constexpr Fp8Format kE4 = Fp8Format::E4M3, kE5 = Fp8Format::E5M2;

// Random finite codes of format f on the GPU: uniform bytes, the NaN/inf ones folded onto small
// magnitudes (NaN outputs would hide a differing kernel from the digest guard and from the test).
Tensor codes(int64_t r, int64_t c, Fp8Format f, uint64_t seed) {
  std::mt19937_64 gen(seed);
  Tensor t = Tensor::empty({r, c}, DType::U8);
  for (int64_t i = 0; i < r * c; ++i) {
    uint8_t b = static_cast<uint8_t>(gen());
    const bool special = f == kE4 ? (b & 0x7F) == 0x7F : (b & 0x7C) == 0x7C;
    if (special) b &= 0xBF;
    t.data<uint8_t>()[i] = b;
  }
  return t.to_device(Device::CUDA);
}

Tensor scalar(float v) { return Tensor::from_vector(std::vector<float>{v}, {1}).to_device(Device::CUDA); }

Tensor random_out(int64_t r, int64_t c, DType dt, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(static_cast<size_t>(r * c));
  for (float& x : v) x = u(gen);
  return Tensor::from_vector(v, {r, c}).to(dt).to_device(Device::CUDA);
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return {p, p + h.numel() * dtype_size(h.dtype())};
}

// One linear layer's FP8 GEMMs, x [M, K] and w [N, K] (tensorwise scales), on fixed inputs: the
// outputs' bytes in order (forward, data gradient, weight gradient after one and two
// accumulations).
std::vector<std::vector<uint8_t>> layer(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  const Tensor x = codes(M, K, kE4, seed), w = codes(N, K, kE4, seed + 1), dy = codes(M, N, kE5, seed + 2);
  const Tensor wt = codes(K, N, kE4, seed + 3), dyt = codes(N, M, kE5, seed + 4), xt = codes(K, M, kE4, seed + 5);
  const Tensor sx = scalar(1.f / 64), sw = scalar(1.f / 128), sg = scalar(1.f / 4096);
  const Tensor residual = random_out(M, N, DType::BF16, seed + 6);
  Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA), dx = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
  Tensor dw = random_out(N, K, DType::F32, seed + 7);
  std::vector<std::vector<uint8_t>> out;
  fp8_gemm_into(x, kE4, sx, w, kE4, sw, &residual, y, true);
  out.push_back(bytes(y));
  fp8_gemm_into(dy, kE5, sg, wt, kE4, sw, nullptr, dx);
  out.push_back(bytes(dx));
  for (int rep = 0; rep < 2; ++rep) {
    fp8_gemm_into(dyt, kE5, sg, xt, kE4, sx, &dw, dw);
    out.push_back(bytes(dw));
  }
  return out;
}

struct Shape {
  int64_t M, N, K;
};

class Fp8GemmTuneGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
    test::gpu();
  }
  void TearDown() override {
    if (test::have_gpu()) set_fp8_gemm_tuning(true);  // the default, for the tests that follow
  }
};

TEST(Fp8GemmTune, ModeFromSetting) {
  using cuda::lt_tune::mode_from;
  EXPECT_TRUE(mode_from(nullptr).on);
  EXPECT_FALSE(mode_from(nullptr).verbose);
  for (const char* off : {"0", "off", "false", "no"}) EXPECT_FALSE(mode_from(off).on) << off;
  EXPECT_TRUE(mode_from("1").on);
  EXPECT_TRUE(mode_from("verbose").on);
  EXPECT_TRUE(mode_from("verbose").verbose);
}

// Off, on, off again: the same bits each time; tuning ran only while on, and off never ran
// another candidate than the heuristic's first (MT_FP8_GEMM_TUNE=0 / MT_GEMM_TUNE=0 keep its choice).
TEST_F(Fp8GemmTuneGpu, TunedBitIdenticalToUntuned) {
  const Shape shapes[] = {{48, 80, 64}, {1040, 3056, 2064}, {2064, 1040, 4112}};
  const Fp8TuneStats start = fp8_gemm_tune_stats();
  for (const Shape s : shapes) {
    SCOPED_TRACE(testing::Message() << s.M << " x " << s.N << " x " << s.K);
    set_fp8_gemm_tuning(false);
    const Fp8TuneStats before = fp8_gemm_tune_stats();
    const auto off = layer(s.M, s.N, s.K, 900);
    const Fp8TuneStats after_off = fp8_gemm_tune_stats();
    EXPECT_EQ(after_off.tuned, before.tuned);
    EXPECT_EQ(after_off.runs_off_default, before.runs_off_default);
    set_fp8_gemm_tuning(true);
    const auto on = layer(s.M, s.N, s.K, 900);
    const Fp8TuneStats after_on = fp8_gemm_tune_stats();
    ASSERT_EQ(on.size(), off.size());
    const char* what[] = {"forward (fast accumulation, residual)", "data gradient", "weight gradient, first",
                          "weight gradient, second"};
    for (size_t i = 0; i < on.size(); ++i) EXPECT_TRUE(on[i] == off[i]) << what[i];
    set_fp8_gemm_tuning(false);
    const auto again = layer(s.M, s.N, s.K, 900);
    EXPECT_EQ(fp8_gemm_tune_stats().runs_off_default, after_on.runs_off_default);
    for (size_t i = 0; i < on.size(); ++i) EXPECT_TRUE(again[i] == off[i]) << what[i] << " (off again)";
    std::printf("[ fp8 tune ] %lld x %lld x %lld: %d plans tuned so far, %lld calls off the default\n",
                static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), after_on.tuned,
                static_cast<long long>(after_on.runs_off_default));
  }
  // Random codes are informative: tuning ran (a tiny shape may offer one candidate only, so over all).
  EXPECT_GT(fp8_gemm_tune_stats().tuned, start.tuned);
}

// The block-scaled GEMMs (fp8_block_gemm.cpp) share the plans' tuning: the forward (1x128 activation
// tiles by 128x128 weight tiles) and the fp32 weight gradient accumulated in place, tuned and not.
TEST_F(Fp8GemmTuneGpu, BlockScaledTunedBitIdenticalToUntuned) {
  const int64_t M = 1152, N = 1552, K = 1280;  // M, K: whole 128-wide blocks (both GEMMs' K)
  const Fp8BlockGemm fwd{M, N, K, kE4, kE4, Fp8Tiles::Rows1x128, Fp8Tiles::Blocks128x128, DType::BF16, false};
  if (!fp8_block_gemm_supported(Device::CUDA, fwd)) GTEST_SKIP() << "no block-scaled FP8 GEMM on this GPU";
  auto scales = [](Fp8Tiles t, int64_t outer, int64_t k, float v) {
    return Tensor::from_vector(std::vector<float>(static_cast<size_t>(fp8::tile_scales(t, outer, k)), v),
                               {fp8::tile_scales(t, outer, k)})
        .to_device(Device::CUDA);
  };
  const Tensor x = codes(M, K, kE4, 950), w = codes(N, K, kE4, 951), xt = codes(K, M, kE4, 952),
               dyt = codes(N, M, kE4, 953);
  const Tensor sx = scales(Fp8Tiles::Rows1x128, M, K, 1.f / 64), sw = scales(Fp8Tiles::Blocks128x128, N, K, 1.f / 128);
  const Tensor sxt = scales(Fp8Tiles::Rows1x128, K, M, 1.f / 64), sdyt = scales(Fp8Tiles::Rows1x128, N, M, 1.f / 4096);
  std::vector<std::vector<uint8_t>> res[2];
  for (int t = 0; t < 2; ++t) {
    set_fp8_gemm_tuning(t == 1);
    Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA), dw = random_out(N, K, DType::F32, 954);
    fp8_block_gemm_into(x, kE4, Fp8Tiles::Rows1x128, sx, w, kE4, Fp8Tiles::Blocks128x128, sw, nullptr, y);
    fp8_block_gemm_into(dyt, kE4, Fp8Tiles::Rows1x128, sdyt, xt, kE4, Fp8Tiles::Rows1x128, sxt, &dw, dw);
    res[t] = {bytes(y), bytes(dw)};
  }
  EXPECT_TRUE(res[0][0] == res[1][0]) << "forward";
  EXPECT_TRUE(res[0][1] == res[1][1]) << "weight gradient";
}

}  // namespace
}  // namespace mt::ops

#endif  // MT_HAVE_CUDA
