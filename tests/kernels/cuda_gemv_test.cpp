// The small-row GEMV (gemv.cu) against the CPU linear (OpenBLAS) on bf16-rounded inputs, for
// every row count it serves (1..16 through its 1, 2, 4, 8 and 16-row instantiations), column and
// reduction tails (N not a multiple of the block's columns, K odd: the scalar path, K a multiple
// of 8 but not of a warp's 256-element sweep), with and without bias and residual, bf16 and fp32
// outputs. Then the choice in gemm.cu: linear_forward runs it only inside an InferenceGemv scope
// and only up to kGemvMaxRows rows; and the decode shapes' time against cuBLASLt's.
#ifdef MT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rel_l2;
using test::rounded;

class GpuGemv : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  }
};

struct Shape3 {
  int64_t M, N, K;
};

// The CPU reference: the fp32 linear, then the residual added (as linear_forward_residual's CPU side).
std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* b,
                             const std::vector<float>* r, const Shape3& s) {
  std::vector<float> y(static_cast<size_t>(s.M * s.N));
  cpu::linear_forward(x.data(), w.data(), b ? b->data() : nullptr, y.data(), s.M, s.N, s.K);
  if (r)
    for (size_t i = 0; i < y.size(); ++i) y[i] += (*r)[i];
  return y;
}

TEST_F(GpuGemv, MatchesTheCpuLinear) {
  int cases = 0;
  for (const int64_t M : {1, 2, 3, 4, 8, 16}) {
    for (const Shape3 base : {Shape3{0, 37, 64}, Shape3{0, 130, 77}, Shape3{0, 9, 1000}, Shape3{0, 515, 2056}}) {
      const Shape3 s{M, base.N, base.K};
      const uint64_t seed = static_cast<uint64_t>(M * 1000 + s.N + s.K);
      const auto x = rounded(random_vec<float>(s.M * s.K, seed, -1, 1));
      const auto w = rounded(random_vec<float>(s.N * s.K, seed + 1, -1, 1));
      const auto b = rounded(random_vec<float>(s.N, seed + 2, -1, 1));
      const auto r = rounded(random_vec<float>(s.M * s.N, seed + 3, -4, 4));
      DeviceBuffer<bf16> gx(x), gw(w), gb(b), gr(r), gy(s.M * s.N);
      DeviceBuffer<float> gb32(b), gy32(s.M * s.N);
      for (const bool bias : {false, true}) {
        for (const bool res : {false, true}) {
          const auto want = reference(x, w, bias ? &b : nullptr, res ? &r : nullptr, s);
          gemv_forward(gx.get(), gw, bias ? gb.get() : nullptr, res ? gr.get() : nullptr, gy.get(), s.M, s.N, s.K,
                       nullptr);
          const double e = rel_l2(gy.download(), want);
          EXPECT_LT(e, 6e-3) << "bf16 M " << s.M << " N " << s.N << " K " << s.K << " bias " << bias << " res " << res;
          ++cases;
        }
        // fp32 output (bf16 inputs): products exact in fp32, only the summation order differs.
        const auto want = reference(x, w, bias ? &b : nullptr, nullptr, s);
        gemv_forward(gx.get(), gw, bias ? gb32.get() : nullptr, nullptr, gy32.get(), s.M, s.N, s.K, nullptr);
        EXPECT_LT(rel_l2(gy32.download(), want), 1e-5) << "fp32 out M " << s.M << " N " << s.N << " K " << s.K;
      }
    }
  }
  EXPECT_EQ(cases, 6 * 4 * 4);
}

// The residual may be the output itself (y += x w^T), as cuBLASLt's C = D.
TEST_F(GpuGemv, ResidualInPlace) {
  const Shape3 s{3, 200, 136};
  const auto x = rounded(random_vec<float>(s.M * s.K, 7)), w = rounded(random_vec<float>(s.N * s.K, 8));
  const auto r = rounded(random_vec<float>(s.M * s.N, 9));
  DeviceBuffer<bf16> gx(x), gw(w), gy(r);
  gemv_forward(gx.get(), gw, nullptr, gy.get(), gy.get(), s.M, s.N, s.K, nullptr);
  EXPECT_LT(rel_l2(gy.download(), reference(x, w, nullptr, &r, s)), 6e-3);
}

std::vector<uint16_t> bits(const DeviceBuffer<bf16>& b) {
  std::vector<uint16_t> h(b.size());
  MT_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

// linear_forward runs the GEMV (the same bits as gemv_forward, and one more call of it) inside
// an InferenceGemv scope for up to kGemvMaxRows rows, and cuBLASLt (no GEMV call, the same bits
// as outside) outside one, inside one closed with `false`, and for more rows.
TEST_F(GpuGemv, ChosenOnlyInInferenceForFewRows) {
  Gemm gemm;
  for (const int64_t M : {int64_t{1}, kGemvChosenMaxRows, kGemvChosenMaxRows + 1, kGemvMaxRows, kGemvMaxRows + 1}) {
    const Shape3 s{M, 96, 264};
    const auto x = rounded(random_vec<float>(s.M * s.K, 1)), w = rounded(random_vec<float>(s.N * s.K, 2));
    const auto b = rounded(random_vec<float>(s.N, 3));
    DeviceBuffer<bf16> gx(x), gw(w), gb(b), blas(s.M * s.N), infer(s.M * s.N), off(s.M * s.N);
    DeviceBuffer<bf16> direct(s.M * s.N);
    if (M <= kGemvMaxRows) gemv_forward(gx.get(), gw, gb, nullptr, direct.get(), s.M, s.N, s.K, nullptr);
    int64_t calls = gemv_calls();
    linear_forward(gemm, gx.get(), gw, gb, blas.get(), s.M, s.N, s.K, nullptr);
    EXPECT_EQ(gemv_calls(), calls) << M;
    {
      const ops::InferenceGemv scope;
      EXPECT_TRUE(ops::InferenceGemv::active());
      linear_forward(gemm, gx.get(), gw, gb, infer.get(), s.M, s.N, s.K, nullptr);
      EXPECT_EQ(gemv_calls(), calls + (M <= kGemvChosenMaxRows ? 1 : 0)) << M;
      calls = gemv_calls();
      const ops::InferenceGemv closed(false);
      linear_forward(gemm, gx.get(), gw, gb, off.get(), s.M, s.N, s.K, nullptr);
      EXPECT_EQ(gemv_calls(), calls) << M;
    }
    EXPECT_FALSE(ops::InferenceGemv::active());
    EXPECT_EQ(bits(infer), M <= kGemvChosenMaxRows ? bits(direct) : bits(blas)) << M;
    EXPECT_EQ(bits(off), bits(blas)) << M;
  }
}

// Decode's shapes (llama-1.5b: QKV, attention output, gate+up, down, vocabulary) at 1 to 16
// rows: the GEMV's time and weight bandwidth (its Wide and Base kernels) against cuBLASLt's.
// Back to back, so weights that fit in L2 (all but fc1 and the vocabulary) may come from it. Printed for the record; the
// GEMV must not lose at one row, the case it exists for.
TEST_F(GpuGemv, DecodeShapesAgainstCublasLt) {
  Gemm gemm;
  cudaEvent_t e0, e1;
  MT_CUDA_CHECK(cudaEventCreate(&e0));
  MT_CUDA_CHECK(cudaEventCreate(&e1));
  auto time_ms = [&](auto&& f) {
    f();
    float best = 1e30f;
    for (int i = 0; i < 5; ++i) {
      MT_CUDA_CHECK(cudaEventRecord(e0));
      for (int k = 0; k < 10; ++k) f();
      MT_CUDA_CHECK(cudaEventRecord(e1));
      MT_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      MT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms / 10);
    }
    return static_cast<double>(best);
  };
  // Cheap deterministic values (the vocabulary's weights are 262M elements): timing only.
  auto pattern = [](int64_t n, uint32_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t h = (static_cast<uint32_t>(i) + seed) * 2654435761u;
      v[static_cast<size_t>(i)] = static_cast<float>(h >> 22) / 1024.f - 0.5f;
    }
    return v;
  };
  double gemv_total = 0, base_total = 0, blas_total = 0;
  for (const Shape3 base : {Shape3{0, 3072, 2048}, Shape3{0, 2048, 2048}, Shape3{0, 16384, 2048},
                            Shape3{0, 2048, 8192}, Shape3{0, 128256, 2048}}) {
    const DeviceBuffer<bf16> gw(pattern(base.N * base.K, 2));
    for (const int64_t M : {1, 2, 4, 8, 16}) {
      const Shape3 s{M, base.N, base.K};
      DeviceBuffer<bf16> gx(pattern(s.M * s.K, 1)), gy(s.M * s.N);
      auto gemv = [&] { gemv_forward(gx.get(), gw, nullptr, nullptr, gy.get(), s.M, s.N, s.K, nullptr); };
      const double tg = time_ms(gemv);  // the Wide kernel (the default)
      double tbase = 0;
      {
        const ops::InferenceGemv base(false, ops::InferenceGemv::Kernel::Base);
        tbase = time_ms(gemv);
      }
      const double tb = time_ms([&] { linear_forward(gemm, gx.get(), gw, nullptr, gy.get(), s.M, s.N, s.K, nullptr); });
      const double gb = 2.0 * static_cast<double>(s.N * s.K) / 1e6;  // weight MB = GB/s per ms
      std::printf("gemv M %2lld N %6lld K %5lld: gemv %.4f ms (%5.0f GB/s)  base %.4f ms (%5.0f GB/s)  cublasLt %.4f "
                  "ms (%5.0f GB/s)\n",
                  static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), tg, gb / tg,
                  tbase, gb / tbase, tb, gb / tb);
      if (M == 1) gemv_total += tg, base_total += tbase, blas_total += tb;
    }
  }
  // Timing only (speed is measured, never asserted in a unit test): the sums at one row.
  std::printf("gemv at 1 row over the shapes: %.4f ms (the Base kernel %.4f ms), cuBLASLt %.4f ms\n", gemv_total,
              base_total, blas_total);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
