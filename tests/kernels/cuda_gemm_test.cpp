// cuBLASLt linear layers against the CPU reference (OpenBLAS): bf16 with fp32 accumulation
// (inputs rounded to bf16 for the reference), fp32 without TF32, the bias epilogue, fp32 main-grad
// accumulation (beta = 1) and the deterministic bias gradient.
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rounded;
using test::rel_l2;

struct Shape3 {
  int64_t M, N, K;
};

TEST(GpuGemm, Bf16MatchesCpu) {
  Gemm gemm;
  for (const Shape3 sh : {Shape3{96, 160, 72}, Shape3{256, 512, 384}, Shape3{100, 130, 70}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    const auto x = rounded(random_vec<float>(M * K, 1, -1, 1)), w = rounded(random_vec<float>(N * K, 2, -1, 1));
    const auto b = rounded(random_vec<float>(N, 3, -1, 1)), dy = rounded(random_vec<float>(M * N, 4, -1, 1));
    const auto dw0 = random_vec<float>(N * K, 5, -1, 1), db0 = random_vec<float>(N, 6, -1, 1);
    std::vector<float> y(M * N), dx(M * K), dw = dw0, db = db0;
    cpu::linear_forward(x.data(), w.data(), b.data(), y.data(), M, N, K);
    cpu::linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), M, N, K);

    DeviceBuffer<bf16> gx(x), gw(w), gb(b), gdy(dy), gy(M * N), gdx(M * K);
    DeviceBuffer<float> gdw(dw0), gdb(db0), gy32(M * N), gb32(b);
    linear_forward(gemm, gx.get(), gw, gb, gy.get(), M, N, K, nullptr);
    linear_forward(gemm, gx.get(), gw.get(), gb32.get(), gy32.get(), M, N, K, nullptr);
    linear_backward(gemm, gdy.get(), gx, gw, gdx, gdw, gdb, M, N, K, nullptr);
    const double ey = rel_l2(gy.download(), y), ey32 = rel_l2(gy32.download(), y), edx = rel_l2(gdx.download(), dx);
    const double edw = rel_l2(gdw.download(), dw), edb = rel_l2(gdb.download(), db);
    std::printf("bf16 gemm %lldx%lldx%lld: y %.2e y32 %.2e dx %.2e dw %.2e db %.2e\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), ey, ey32, edx, edw, edb);
    EXPECT_LT(ey, 1e-2);
    // bf16 products are exact in fp32: only the summation order (and the tensor cores' fp32
    // accumulation) differ from the CPU.
    EXPECT_LT(ey32, 1e-4);
    EXPECT_LT(edx, 1e-2);
    EXPECT_LT(edw, 1e-4);
    EXPECT_LT(edb, 1e-5);
  }
}

TEST(GpuGemm, Fp32MatchesCpu) {
  Gemm gemm;
  const int64_t M = 70, N = 50, K = 90;
  const auto x = random_vec<float>(M * K, 11), w = random_vec<float>(N * K, 12), b = random_vec<float>(N, 13);
  const auto dy = random_vec<float>(M * N, 14), dw0 = random_vec<float>(N * K, 15);
  std::vector<float> y(M * N), dx(M * K), dw = dw0, db(N, 0.f);
  cpu::linear_forward(x.data(), w.data(), b.data(), y.data(), M, N, K);
  cpu::linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), M, N, K);
  DeviceBuffer<float> gx(x), gw(w), gb(b), gdy(dy), gy(M * N), gdx(M * K), gdw(dw0), gdb(std::vector<float>(N, 0.f));
  linear_forward(gemm, gx.get(), gw.get(), gb.get(), gy.get(), M, N, K, nullptr);
  linear_backward(gemm, gdy.get(), gx.get(), gw.get(), gdx.get(), gdw.get(), gdb.get(), M, N, K, nullptr);
  EXPECT_LT(rel_l2(gy.download(), y), 1e-5);
  EXPECT_LT(rel_l2(gdx.download(), dx), 1e-5);
  EXPECT_LT(rel_l2(gdw.download(), dw), 1e-5);
  EXPECT_LT(rel_l2(gdb.download(), db), 1e-5);
}

TEST(GpuGemm, Deterministic) {
  Gemm gemm;
  const int64_t M = 1024, N = 768, K = 512;
  const auto x = random_vec<float>(M * K, 21), w = random_vec<float>(N * K, 22), dy = random_vec<float>(M * N, 23);
  std::vector<std::vector<uint8_t>> runs;
  for (int r = 0; r < 2; ++r) {
    DeviceBuffer<bf16> gx(x), gw(w), gdy(dy), gy(M * N), gdx(M * K);
    DeviceBuffer<float> gdw(std::vector<float>(N * K, 0.f)), gdb(std::vector<float>(N, 0.f));
    linear_forward(gemm, gx.get(), gw, static_cast<const bf16*>(nullptr), gy.get(), M, N, K, nullptr);
    linear_backward(gemm, gdy.get(), gx, gw, gdx, gdw, gdb, M, N, K, nullptr);
    auto all = gy.bytes();
    for (const auto& part : {gdx.bytes(), gdw.bytes(), gdb.bytes()}) all.insert(all.end(), part.begin(), part.end());
    runs.push_back(std::move(all));
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
