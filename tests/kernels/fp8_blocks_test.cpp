// The blockwise FP8 ops (ops.def; kernels/fp8_blocks.h): on the CPU, the casts' codes and scales
// against the emulation (fp8_fake_quantize_blocks: the same tiles, scales and rounding) and the
// block-scaled GEMM against the fp32 GEMM of the read-back operands; on the GPU, the casts byte for
// byte against the CPU and cuBLASLt's block-scaled GEMM against the CPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

constexpr Fp8Tiles kRows = Fp8Tiles::Rows1x128, kBlocks = Fp8Tiles::Blocks128x128;

// x [R, C] in values bf16 holds exactly, magnitudes spread over 2^-8 .. 2^8 by row and by column
// tile (so tiles get different scales), and, where the shape has one, an all-zero 128x128 tile.
Tensor sample(int64_t R, int64_t C, uint64_t seed) {
  std::vector<float> v = test::random_vec<float>(static_cast<size_t>(R * C), seed);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float& e = v[static_cast<size_t>(r * C + c)];
      e = (r >= 128 && r < 256 && c < 128) ? 0.f : std::ldexp(e, static_cast<int>(r % 9) - 8 + 4 * static_cast<int>(c / 128 % 3));
    }
  return Tensor::from_vector(test::rounded(v), {R, C});
}

Tensor u8(int64_t r, int64_t c, Device d = Device::CPU) { return Tensor::empty({r, c}, DType::U8, d); }
Tensor f32(int64_t n, Device d = Device::CPU) { return Tensor::empty({n}, DType::F32, d); }

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  return {h.data<uint8_t>(), h.data<uint8_t>() + h.numel()};
}

// The values a GEMM reads from codes q [outer, K]: code * its tile's scale_inv.
std::vector<float> read_back(const Tensor& q, Fp8Format f, Fp8Tiles t, const Tensor& scale_inv) {
  const int64_t outer = q.dim(0), K = q.dim(1);
  const std::vector<float> si = scale_inv.to_vector();
  std::vector<float> v(static_cast<size_t>(outer * K));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < K; ++k)
      v[static_cast<size_t>(o * K + k)] = fp8_decode(q.data<uint8_t>()[o * K + k], f) *
                                          si[static_cast<size_t>(fp8::tile_scale_index(t, outer, K, o, k))];
  return v;
}

std::vector<float> transposed(const std::vector<float>& v, int64_t R, int64_t C) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) t[static_cast<size_t>(c * R + r)] = v[static_cast<size_t>(r * C + c)];
  return t;
}

// The emulation of x in tile_r x tile_c tiles: the read-back values and the scales' inverses
// (row-major over the tile grid).
struct Emulated {
  std::vector<float> values, scale_invs;
};
Emulated emulate(const Tensor& x, Fp8Format f, int64_t tile_r, int64_t tile_c) {
  Tensor s = Tensor::zeros({((x.dim(0) + tile_r - 1) / tile_r) * ((x.dim(1) + tile_c - 1) / tile_c)});
  Emulated e{fp8_fake_quantize_blocks(x, f, tile_r, tile_c, s).to_vector(), s.to_vector()};
  for (float& v : e.scale_invs) v = 1.f / v;
  return e;
}

TEST(Fp8Blocks, RowCastsReadBackAsTheEmulation) {
  const int64_t R = 272, C = 400;  // partial tiles in both directions
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(fp8_format_name(f));
    const Tensor x = sample(R, C, 1);
    Tensor q = u8(R, C), qs = f32(fp8::tile_scales(kRows, R, C)), qt = u8(C, R), qts = f32(fp8::tile_scales(kRows, C, R));
    fp8_block_cast_rows(x, f, q, qs, &qt, &qts);
    const Emulated rows = emulate(x, f, 1, 128), cols = emulate(x, f, 128, 1);
    EXPECT_EQ(read_back(q, f, kRows, qs), rows.values);
    EXPECT_EQ(read_back(qt, f, kRows, qts), transposed(cols.values, R, C));
    // Scales: the emulation's grids [R][C/128] and [R/128][C]; cuBLASLt's [C/128][R] and [R/128][C].
    const std::vector<float> got = qs.to_vector();
    const int64_t tc = fp8::tiles_of(C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < tc; ++j)
        ASSERT_EQ(got[static_cast<size_t>(j * R + r)], rows.scale_invs[static_cast<size_t>(r * tc + j)]) << r << " " << j;
    EXPECT_EQ(qts.to_vector(), cols.scale_invs);
    EXPECT_EQ(got[130], 1.f);  // row 130 of the all-zero tile: scale 1
  }
}

TEST(Fp8Blocks, TileCastsReadBackAsTheEmulationAndPadTheScaleRows) {
  const int64_t R = 300, C = 200;  // 3 x 2 tiles: scale rows padded to 4
  const Fp8Format f = Fp8Format::E4M3;
  const Tensor x = sample(R, C, 2);
  Tensor q = u8(R, C), qs = f32(fp8::tile_scales(kBlocks, R, C)), qt = u8(C, R), qts = f32(fp8::tile_scales(kBlocks, C, R));
  fp8_block_cast_tiles(x, f, q, qs, &qt, &qts);
  const Emulated e = emulate(x, f, 128, 128);
  EXPECT_EQ(read_back(q, f, kBlocks, qs), e.values);
  EXPECT_EQ(read_back(qt, f, kBlocks, qts), transposed(e.values, R, C));
  EXPECT_EQ(qs.to_vector(), (std::vector<float>{e.scale_invs[0], e.scale_invs[1], 0, 0, e.scale_invs[2],
                                                e.scale_invs[3], 0, 0, e.scale_invs[4], e.scale_invs[5], 0, 0}));
  EXPECT_EQ(qts.to_vector(), (std::vector<float>{e.scale_invs[0], e.scale_invs[2], e.scale_invs[4], 0,
                                                 e.scale_invs[1], e.scale_invs[3], e.scale_invs[5], 0}));
  EXPECT_EQ(e.scale_invs[2], 1.f);  // rows 128..255 x columns 0..127: all zeros
}

// The codes and scales of x cast in `tiles` (the rows cast for Rows1x128).
struct Operand {
  Tensor q, si;
  Fp8Format f;
  Fp8Tiles t;
};
Operand cast(const Tensor& x, Fp8Format f, Fp8Tiles t) {
  const Device d = x.device();
  Operand o{u8(x.dim(0), x.dim(1), d), f32(fp8::tile_scales(t, x.dim(0), x.dim(1)), d), f, t};
  if (t == kRows) fp8_block_cast_rows(x, f, o.q, o.si, nullptr, nullptr);
  else fp8_block_cast_tiles(x, f, o.q, o.si, nullptr, nullptr);
  return o;
}

TEST(Fp8Blocks, GemmIsTheFp32GemmOfTheReadBackOperands) {
  const int64_t M = 64, N = 48, K = 384;
  const Operand a = cast(sample(M, K, 3), Fp8Format::E5M2, kRows);
  const Tensor c = sample(M, N, 5);
  for (Fp8Tiles bt : {kBlocks, kRows}) {
    const Operand b = cast(sample(N, K, 4), Fp8Format::E4M3, bt);
    Tensor d = Tensor::empty({M, N});
    fp8_block_gemm_into(a.q, a.f, a.t, a.si, b.q, b.f, b.t, b.si, &c, d);
    const Tensor want = linear_forward(Tensor::from_vector(read_back(a.q, a.f, a.t, a.si), {M, K}),
                                       Tensor::from_vector(read_back(b.q, b.f, b.t, b.si), {N, K}), nullptr);
    std::vector<float> w = want.to_vector();
    const std::vector<float> cv = c.to_vector();
    for (size_t i = 0; i < w.size(); ++i) w[i] += cv[i];
    EXPECT_LT(test::rel_l2(d.to_vector(), w), 1e-5);  // summation order only
  }
  const Operand b = cast(sample(N, K, 4), Fp8Format::E4M3, kBlocks);
  Tensor d = Tensor::empty({M, N});
  EXPECT_THROW(fp8_block_gemm_into(b.q, b.f, b.t, b.si, b.q, b.f, b.t, b.si, nullptr, d), mt::Error);
}

// ---- GPU

Tensor on_gpu(const Tensor& x) { return x.to(DType::BF16).to_device(Device::CUDA); }

TEST(Fp8BlocksGpu, CastsMatchTheCpuByteForByte) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 384}, {272, 400}, {128, 2048}})
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(testing::Message() << R << " x " << C << " " << fp8_format_name(f));
      const Tensor x = sample(R, C, 7), xg = on_gpu(x);
      for (Fp8Tiles t : {kRows, kBlocks}) {
        Tensor q = u8(R, C), qs = f32(fp8::tile_scales(t, R, C)), qt = u8(C, R), qts = f32(fp8::tile_scales(t, C, R));
        Tensor gq = u8(R, C, Device::CUDA), gqs = f32(qs.numel(), Device::CUDA), gqt = u8(C, R, Device::CUDA),
               gqts = f32(qts.numel(), Device::CUDA);
        auto run = t == kRows ? fp8_block_cast_rows : fp8_block_cast_tiles;
        run(x, f, q, qs, &qt, &qts);
        run(xg, f, gq, gqs, &gqt, &gqts);
        EXPECT_EQ(bytes(gq), bytes(q));
        EXPECT_EQ(bytes(gqt), bytes(qt));
        EXPECT_EQ(gqs.to_device(Device::CPU).to_vector(), qs.to_vector());
        EXPECT_EQ(gqts.to_device(Device::CPU).to_vector(), qts.to_vector());
        Tensor none, none_s, only = u8(C, R, Device::CUDA), only_s = f32(qts.numel(), Device::CUDA);
        run(xg, f, none, none_s, &only, &only_s);  // the transposed codes alone (a backward's re-cast)
        EXPECT_EQ(bytes(only), bytes(qt));
      }
    }
}

Operand to_gpu(const Operand& o) { return {o.q.to_device(Device::CUDA), o.si.to_device(Device::CUDA), o.f, o.t}; }

// GPU against CPU on the same codes and scales. Within a 128-wide K block Hopper's FP8 tensor cores
// add with less than fp32's precision before cuBLASLt applies the block's scales and promotes to
// fp32 (DeepSeek-V3's report: about 14 bits), hence 5e-4 for f32 outputs; bf16 outputs round.
void expect_gemm(const char* what, int64_t M, int64_t N, int64_t K, Fp8Format af, Fp8Tiles at, Fp8Format bf,
                 Fp8Tiles bt, DType out, bool with_c, bool must_run) {
  SCOPED_TRACE(what);
  const Fp8BlockGemm g{M, N, K, af, bf, at, bt, out, with_c};
  if (!fp8_block_gemm_supported(Device::CUDA, g)) {
    EXPECT_FALSE(must_run) << "cuBLASLt offers no algorithm";
    std::printf("[ fp8 blocks ] %s: cuBLASLt offers no algorithm on this GPU\n", what);
    return;
  }
  const Operand a = cast(sample(M, K, 11), af, at), b = cast(sample(N, K, 12), bf, bt);
  const Tensor c = sample(M, N, 13);
  Tensor d = Tensor::empty({M, N});
  fp8_block_gemm_into(a.q, af, at, a.si, b.q, bf, bt, b.si, with_c ? &c : nullptr, d);
  const Operand ag = to_gpu(a), bg = to_gpu(b);
  Tensor dg = with_c ? c.to(out).to_device(Device::CUDA) : Tensor::empty({M, N}, out, Device::CUDA);
  fp8_block_gemm_into(ag.q, af, at, ag.si, bg.q, bf, bt, bg.si, with_c ? &dg : nullptr, dg);
  const double err = test::rel_l2(dg.to_device(Device::CPU).to(DType::F32).to_vector(), d.to_vector());
  EXPECT_LT(err, out == DType::F32 ? 5e-4 : 1e-2);
  std::printf("[ fp8 blocks ] %s: %lld x %lld x %lld, relative error %.2e\n", what, static_cast<long long>(M),
              static_cast<long long>(N), static_cast<long long>(K), err);
}

TEST(Fp8BlocksGpu, BlockScaledGemmMatchesTheCpu) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  expect_gemm("forward (1x128 . 128x128, bf16)", 256, 384, 384, e4, kRows, e4, kBlocks, DType::BF16, false, true);
  expect_gemm("forward + residual", 256, 384, 384, e4, kRows, e4, kBlocks, DType::BF16, true, true);
  expect_gemm("weight gradient (1x128 . 1x128, f32 += )", 128, 384, 256, e4, kRows, e4, kRows, DType::F32, true, true);
  expect_gemm("hybrid data gradient (E5M2 . E4M3)", 256, 384, 128, e5, kRows, e4, kBlocks, DType::BF16, false, false);
  expect_gemm("hybrid weight gradient (E5M2 . E4M3)", 128, 384, 256, e5, kRows, e4, kRows, DType::F32, true, false);
}

}  // namespace
}  // namespace mt::ops
