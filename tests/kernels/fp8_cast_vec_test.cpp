// The GPU's vector FP8 kernels (kernels/cuda/fp8.cu, fp8_codes.cu; fp8_tile.cuh's 256 x 64 tiles
// of 8x8 lane blocks) byte for byte against the CPU on the shapes that stress the layout: one lane
// block (8 x 8), a tile plus one block row and column (264 x 72), whole tiles (256 x 64, 512 x 128),
// a wide one-block-high row (8 x 1032) and odd multiples of 8 (520 x 200). Codes row-major and
// transposed (together and alone), the amax pass, the current-scaling cast (scale, its copy and
// inverse), the clipped count, and the transpose of codes; then SwiGLU's fused casts (whose loaders
// the vector kernel calls) against the unfused op and cast on the GPU, on edge shapes. Both vector
// kernels: the lane blocks (the default) and the shared-memory tiles (MT_FP8_CAST_KERNEL=tile).
#ifdef MT_HAVE_CUDA

#include <gtest/gtest.h>

#include <functional>
#include <utility>
#include <vector>

#include "core/fp8.h"
#include "kernels/cuda/fp8_cast_kernel.h"
#include "kernels/fp8_codes.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

struct Dims {
  int64_t R, C;
};
constexpr Dims kShapes[] = {{8, 8}, {264, 72}, {256, 64}, {512, 128}, {8, 1032}, {520, 200}};

// bf16-exact values in [-mag, mag]: f32 on the CPU, bf16 on the GPU (the same numbers).
Tensor input(Device d, int64_t R, int64_t C, uint64_t seed, double mag) {
  const Tensor t = Tensor::from_vector(test::rounded(test::random_vec<float>(static_cast<size_t>(R * C), seed, -mag, mag)),
                                       {R, C});
  return d == Device::CPU ? t : t.to(DType::BF16).to_device(d);
}
Tensor scalar(Device d, float v = 0.f) { return Tensor::from_vector(std::vector<float>{v}, {1}).to_device(d); }

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return {p, p + h.nbytes()};
}

// Everything the casts of x produce on device d, as bytes, in a fixed order.
std::vector<std::vector<uint8_t>> casts(Device d, Dims s, uint64_t seed, double mag, Fp8Format f) {
  const Tensor x = input(d, s.R, s.C, seed, mag);
  std::vector<std::vector<uint8_t>> out;
  Tensor amax = scalar(d);
  fp8_amax(x, amax);
  out.push_back(bytes(amax));
  // A scale that clips some elements (a quarter of what the amax asks for would fit).
  const Tensor scale = scalar(d, 4.f * fp8_max(f) / static_cast<float>(mag));
  Tensor q = Tensor::empty({s.R, s.C}, DType::U8, d), qt = Tensor::empty({s.C, s.R}, DType::U8, d);
  Tensor seen = scalar(d), sat = Tensor::zeros({1}, DType::I64, d);
  fp8_cast_transpose(x, scale, f, q, &qt, seen, sat);
  for (const Tensor* t : {&q, &qt, &seen, &sat}) out.push_back(bytes(*t));
  Tensor q_only = Tensor::empty({s.R, s.C}, DType::U8, d), none, qt_only = Tensor::empty({s.C, s.R}, DType::U8, d);
  Tensor seen2 = scalar(d), sat2 = Tensor::zeros({1}, DType::I64, d);
  fp8_cast_transpose(x, scale, f, q_only, nullptr, seen2, sat2);
  fp8_cast_transpose(x, scale, f, none, &qt_only, seen2, sat2);
  for (const Tensor* t : {&q_only, &qt_only, &sat2}) out.push_back(bytes(*t));
  Tensor cs = scalar(d), used = scalar(d), inv = scalar(d), cq = Tensor::empty({s.R, s.C}, DType::U8, d),
         cqt = Tensor::empty({s.C, s.R}, DType::U8, d), csat = Tensor::zeros({1}, DType::I64, d);
  fp8_cast_transpose_current(x, amax, f, cs, used, inv, cq, &cqt, csat);
  for (const Tensor* t : {&cs, &used, &inv, &cq, &cqt, &csat}) out.push_back(bytes(*t));
  Tensor tq = Tensor::empty({s.C, s.R}, DType::U8, d);
  fp8_transpose_codes(cq, tq);
  out.push_back(bytes(tq));
  return out;
}

// Runs f once with each vector kernel, then leaves the default (lane blocks) on.
void with_each_kernel(const std::function<void()>& f) {
  for (const bool tiles : {false, true}) {
    SCOPED_TRACE(tiles ? "shared-memory tiles" : "lane blocks");
    gpu::set_fp8_cast_smem_tiles(tiles);
    f();
  }
  gpu::set_fp8_cast_smem_tiles(false);
}

void edge_shapes_match_the_cpu() {
  const char* what[] = {"amax",          "q",          "qt",          "amax seen by the cast", "clipped",
                        "q alone",       "qt alone",   "clipped (alone)",       "current scale",
                        "its copy",      "its inverse", "current q",  "current qt",            "current clipped",
                        "codes transposed"};
  uint64_t seed = 500;
  for (const Dims s : kShapes)
    for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (const double mag : {0.5, 300.0}) {
        SCOPED_TRACE(testing::Message() << s.R << " x " << s.C << " " << fp8_format_name(f) << " mag " << mag);
        const auto gpu = casts(Device::CUDA, s, ++seed, mag, f), cpu = casts(Device::CPU, s, seed, mag, f);
        ASSERT_EQ(gpu.size(), cpu.size());
        for (size_t i = 0; i < gpu.size(); ++i) EXPECT_TRUE(gpu[i] == cpu[i]) << what[i];
      }
}

TEST(Fp8CastVecGpu, EdgeShapesMatchTheCpuByteForByte) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  with_each_kernel(edge_shapes_match_the_cpu);
}

// SwiGLU's fused casts read through the vector kernel's loaders: the same bytes as the op then
// the cast, on shapes with partial tiles (F = 72: 2F = 144 columns, 264 rows).
void fused_swiglu_casts_are_unfused() {
  const Device d = Device::CUDA;
  for (const Dims s : {Dims{264, 72}, Dims{8, 8}, Dims{520, 200}}) {
    SCOPED_TRACE(testing::Message() << s.R << " x " << s.C);
    const int64_t R = s.R, F = s.C;
    const Tensor h = input(d, R, 2 * F, 90, 3.0), dy = input(d, R, F, 91, 2.0);
    const Tensor scale = scalar(d, 100.f);  // clips the larger values
    auto run = [&](int64_t C, const std::function<void(Tensor&, Tensor&, Tensor&, Tensor&)>& op) {
      Tensor q = Tensor::empty({R, C}, DType::U8, d), qt = Tensor::empty({C, R}, DType::U8, d), a = scalar(d),
             sat = Tensor::zeros({1}, DType::I64, d);
      op(q, qt, a, sat);
      return std::vector<std::vector<uint8_t>>{bytes(q), bytes(qt), bytes(a), bytes(sat)};
    };
    const auto fwd = run(F, [&](Tensor& q, Tensor& qt, Tensor& a, Tensor& sat) {
      swiglu_forward_fp8(h, scale, Fp8Format::E4M3, q, &qt, a, sat);
    });
    EXPECT_TRUE(fwd == run(F, [&](Tensor& q, Tensor& qt, Tensor& a, Tensor& sat) {
                  fp8_cast_transpose(swiglu_forward(h), scale, Fp8Format::E4M3, q, &qt, a, sat);
                })) << "forward";
    const auto bwd = run(2 * F, [&](Tensor& q, Tensor& qt, Tensor& a, Tensor& sat) {
      swiglu_backward_fp8(dy, h, scale, Fp8Format::E5M2, q, &qt, a, sat);
    });
    EXPECT_TRUE(bwd == run(2 * F, [&](Tensor& q, Tensor& qt, Tensor& a, Tensor& sat) {
                  fp8_cast_transpose(swiglu_backward(dy, h), scale, Fp8Format::E5M2, q, &qt, a, sat);
                })) << "backward";
    Tensor fused = scalar(d), plain = scalar(d);
    swiglu_backward_amax(dy, h, fused);
    swiglu_backward(dy, h, &plain);
    EXPECT_TRUE(bytes(fused) == bytes(plain)) << "SwiGLU backward's amax";
  }
}

TEST(Fp8CastVecGpu, FusedSwigluCastsOnEdgeShapes) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  with_each_kernel(fused_swiglu_casts_are_unfused);
}

}  // namespace
}  // namespace mt::ops

#endif  // MT_HAVE_CUDA
