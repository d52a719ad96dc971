// The FP8 producer fusion (ops.def: swiglu_forward, swiglu_backward, rmsnorm_forward and
// add_rmsnorm_forward with an amax output; swiglu_forward_fp8 and swiglu_backward_fp8). Its
// acceptance test is bit equality with the unfused path on the GPU: the same output bytes, the
// same amax as fp8_amax's pass over that output, and the same FP8 codes (row-major and
// transposed). The GPU-vs-CPU comparison of the ops is backend_ops_test.cpp's fp8_producer
// case; on the CPU the fused ops compose the unfused ones by construction, checked here too.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "kernels/fp8_codes.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

// Values in [lo, hi] that bf16 holds exactly, bf16 on the GPU (the model's storage), f32 on the CPU.
Tensor input(Device d, const Shape& s, uint64_t seed, double lo = -1, double hi = 1) {
  const Tensor t = Tensor::from_vector(test::rounded(test::random_vec<float>(shape_numel(s), seed, lo, hi)), s);
  return d == Device::CPU ? t : t.to(DType::BF16).to_device(d);
}
Tensor scalar(Device d) { return Tensor::zeros({1}, DType::F32, d); }

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to_device(Device::CPU), hb = b.to_device(Device::CPU);
  return ha.dtype() == hb.dtype() && ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// The current-scaling cast of y [R, C] from `amax`: codes row-major and transposed.
std::pair<Tensor, Tensor> cast(const Tensor& y, const Tensor& amax, Fp8Format f) {
  const Device d = y.device();
  const Tensor y2 = y.view({y.numel() / y.dim(-1), y.dim(-1)});
  const int64_t R = y2.dim(0), C = y2.dim(1);
  Tensor scale = scalar(d), seen = scalar(d), sat = Tensor::zeros({1}, DType::I64, d);
  fp8_current_scale(amax, scale, fp8_max(f));
  Tensor q = Tensor::empty({R, C}, DType::U8, d), qt = Tensor::empty({C, R}, DType::U8, d);
  fp8_cast_transpose(y2, scale, f, q, &qt, seen, sat);
  return {q, qt};
}

// A producer run fused (amax given) and plain (amax null).
using Producer = std::function<Tensor(Tensor* amax)>;

// The fused run against the plain run and fp8_amax over its output: the same bytes everywhere.
void expect_fused_is_unfused(const Producer& op, Device d, Fp8Format f) {
  Tensor fused_amax = scalar(d), plain_amax = scalar(d);
  const Tensor fused = op(&fused_amax), plain = op(nullptr);
  EXPECT_TRUE(same_bytes(fused, plain)) << "the output changed";
  fp8_amax(plain, plain_amax);
  const float a = fused_amax.to_device(Device::CPU).to_vector()[0], b = plain_amax.to_device(Device::CPU).to_vector()[0];
  EXPECT_TRUE(same_bytes(fused_amax, plain_amax)) << "amax " << a << " against fp8_amax's " << b;
  EXPECT_GT(a, 0.f);
  const auto [q1, qt1] = cast(fused, fused_amax, f);
  const auto [q2, qt2] = cast(plain, plain_amax, f);
  EXPECT_TRUE(same_bytes(q1, q2)) << "row-major codes differ";
  EXPECT_TRUE(same_bytes(qt1, qt2)) << "transposed codes differ";
}

// Every producer over shapes that reach each kernel path: SwiGLU's vector and scalar paths (F a
// multiple of 8 or not); RMSNorm's warp kernel (row in registers, 1 and 8 vectors a lane, a last
// block with idle warps: 37 rows), its block kernel (8192 columns), and the scalar path (100).
using Sizes = std::initializer_list<std::pair<int64_t, int64_t>>;
void all_producers(Device d) {
  for (const auto& [rows, F] : Sizes{{64, 1024}, {37, 20}}) {
    SCOPED_TRACE("swiglu " + std::to_string(rows) + " x " + std::to_string(F));
    const Tensor h = input(d, {rows, 2 * F}, 1, -4, 4), dy = input(d, {rows, F}, 2, -0.01, 0.01);
    expect_fused_is_unfused([&](Tensor* a) { return swiglu_forward(h, a); }, d, Fp8Format::E4M3);
    expect_fused_is_unfused([&](Tensor* a) { return swiglu_backward(dy, h, a); }, d, Fp8Format::E5M2);
  }
  for (const auto& [rows, dim] : Sizes{{37, 64}, {64, 2048}, {16, 8192}, {37, 100}}) {
    SCOPED_TRACE("rmsnorm " + std::to_string(rows) + " x " + std::to_string(dim));
    const Tensor x = input(d, {rows, dim}, 3, -3, 3), res = input(d, {rows, dim}, 4), w = input(d, {dim}, 5, 0.5, 2);
    expect_fused_is_unfused([&](Tensor* a) {
      Tensor rstd;
      return rmsnorm_forward(x, w, 1e-5f, rstd, a);
    }, d, Fp8Format::E4M3);
    expect_fused_is_unfused([&](Tensor* a) {
      Tensor rstd, sum;
      return add_rmsnorm_forward(x, res, w, 1e-5f, rstd, sum, a);
    }, d, Fp8Format::E4M3);
  }
}

// Delayed scaling's fused casts (swiglu_forward_fp8, swiglu_backward_fp8) against the unfused
// pair: the same codes both ways, amax and clipped count, with a scale that clips some elements.
// Shapes: the vector kernel (whole and partial 64-wide tiles, a tile across the gradient's two
// halves: F = 1000) and the fallback (37 rows).
void expect_fused_cast_is_unfused(Device d) {
  for (const auto& [rows, F] : Sizes{{64, 1024}, {64, 1000}, {16, 24}, {37, 20}}) {
    SCOPED_TRACE("swiglu cast " + std::to_string(rows) + " x " + std::to_string(F));
    const Tensor h = input(d, {rows, 2 * F}, 6, -4, 4), dy = input(d, {rows, F}, 7, -2, 2);
    const Tensor scale = Tensor::from_vector(std::vector<float>{150.f}, {1}).to_device(d);
    struct Cast {
      Tensor q, qt, amax, sat;
    };
    auto run = [&](int64_t C, Fp8Format f, const std::function<void(Cast&)>& op) {
      Cast c{Tensor::empty({rows, C}, DType::U8, d), Tensor::empty({C, rows}, DType::U8, d), scalar(d),
             Tensor::zeros({1}, DType::I64, d)};
      op(c);
      return c;
    };
    auto expect_same = [](const Cast& a, const Cast& b) {
      EXPECT_TRUE(same_bytes(a.q, b.q)) << "row-major codes differ";
      EXPECT_TRUE(same_bytes(a.qt, b.qt)) << "transposed codes differ";
      EXPECT_TRUE(same_bytes(a.amax, b.amax)) << "amax differs";
      EXPECT_TRUE(same_bytes(a.sat, b.sat)) << "clipped count differs";
    };
    const Cast fwd = run(F, Fp8Format::E4M3, [&](Cast& c) {
      swiglu_forward_fp8(h, scale, Fp8Format::E4M3, c.q, &c.qt, c.amax, c.sat);
    });
    expect_same(fwd, run(F, Fp8Format::E4M3, [&](Cast& c) {
                  fp8_cast_transpose(swiglu_forward(h), scale, Fp8Format::E4M3, c.q, &c.qt, c.amax, c.sat);
                }));
    EXPECT_GT(fwd.sat.to_device(Device::CPU).data<int64_t>()[0], 0);  // the clipping path ran
    const Cast bwd = run(2 * F, Fp8Format::E5M2, [&](Cast& c) {
      swiglu_backward_fp8(dy, h, scale, Fp8Format::E5M2, c.q, &c.qt, c.amax, c.sat);
    });
    expect_same(bwd, run(2 * F, Fp8Format::E5M2, [&](Cast& c) {
                  fp8_cast_transpose(swiglu_backward(dy, h), scale, Fp8Format::E5M2, c.q, &c.qt, c.amax, c.sat);
                }));
  }
}

// The opt-in casts (model/fp8.h, Fp8Switches) against what they replace, on one device: the same
// bytes. fp8_cast_transpose_current against fp8_current_scale + fp8_cast_transpose +
// fp8_snapshot_scale, fp8_transpose_codes of the codes against the transposed re-cast, and
// swiglu_backward_amax against swiglu_backward's amax. Model shapes (multiples of 64) and a few
// magnitudes, one of them clipping.
void expect_opt_in_casts_are_the_defaults(Device d) {
  const int64_t rows = 128, F = 192;
  for (const double mag : {0.01, 1.0, 300.0}) {
    SCOPED_TRACE(mag);
    const Tensor x = input(d, {rows, 2 * F}, 60, -mag, mag);
    Tensor amax = scalar(d);
    fp8_amax(x, amax);
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      // An amax below the truth (about a quarter of it), as a TP peer's could never be but a
      // saturating cast needs: the clipped counts must agree too.
      Tensor four = scalar(d), low = scalar(d), ignored = scalar(d);
      fp8_current_scale(amax, four, 4.f);         // 4 / amax
      fp8_snapshot_scale(four, ignored, low);     // amax / 4
      for (const Tensor* a : {&amax, &low}) {
        Tensor s1 = scalar(d), u1 = scalar(d), i1 = scalar(d), sat1 = Tensor::zeros({1}, DType::I64, d);
        Tensor q1 = Tensor::empty({rows, 2 * F}, DType::U8, d), qt1 = Tensor::empty({2 * F, rows}, DType::U8, d);
        fp8_cast_transpose_current(x, *a, f, s1, u1, i1, q1, &qt1, sat1);
        Tensor s2 = scalar(d), u2 = scalar(d), i2 = scalar(d), seen = scalar(d), sat2 = Tensor::zeros({1}, DType::I64, d);
        Tensor q2 = Tensor::empty({rows, 2 * F}, DType::U8, d), qt2 = Tensor::empty({2 * F, rows}, DType::U8, d);
        fp8_current_scale(*a, s2, fp8_max(f));
        fp8_cast_transpose(x, s2, f, q2, &qt2, seen, sat2);
        fp8_snapshot_scale(s2, u2, i2);
        const std::pair<Tensor*, Tensor*> same[] = {{&q1, &q2}, {&qt1, &qt2}, {&s1, &s2},
                                                    {&u1, &u2}, {&i1, &i2}, {&sat1, &sat2}};
        for (const auto& [p, q] : same) EXPECT_TRUE(same_bytes(*p, *q));
        Tensor t = Tensor::empty({2 * F, rows}, DType::U8, d);
        fp8_transpose_codes(q1, t);
        EXPECT_TRUE(same_bytes(t, qt1)) << "the transposed codes are not the transposed cast";
      }
    }
    const Tensor h = input(d, {rows, 2 * F}, 61, -3, 3), dy = input(d, {rows, F}, 62, -mag, mag);
    Tensor fused = scalar(d), plain = scalar(d);
    swiglu_backward_amax(dy, h, fused);
    swiglu_backward(dy, h, &plain);
    EXPECT_TRUE(same_bytes(fused, plain)) << "SwiGLU backward's amax without its output";
  }
}

TEST(Fp8OptInCasts, CpuComposesTheDefaults) { expect_opt_in_casts_are_the_defaults(Device::CPU); }

TEST(Fp8OptInCastsGpu, SameBytesAsTheDefaults) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_opt_in_casts_are_the_defaults(Device::CUDA);
}

TEST(Fp8ProducerCast, CpuComposesTheOpAndCast) { expect_fused_cast_is_unfused(Device::CPU); }

TEST(Fp8ProducerCastGpu, FusedCodesAreTheUnfusedBytes) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_fused_cast_is_unfused(Device::CUDA);
}

TEST(Fp8ProducerAmax, CpuComposesTheOpAndAmax) { all_producers(Device::CPU); }

TEST(Fp8ProducerAmaxGpu, FusedAmaxAndCodesAreTheUnfusedBytes) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  all_producers(Device::CUDA);
}

}  // namespace
}  // namespace mt::ops
