// cuBLASLt autotuning (gemm.cu): a Gemm with tuning on must give the same bits as one with
// tuning off (the heuristic default) for the forward, dgrad and the fp32 wgrad accumulation
// (which must add into dw exactly once, though tuning runs candidates on its inputs), still
// match the CPU reference, and put tuning off on inputs that cannot tell kernels apart. Also the
// deterministic bias gradient (column sums of dy) against a host sum.
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rounded;
using test::rel_l2;

class GpuGemmTune : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  }
};

struct Shape3 {
  int64_t M, N, K;
};

// Host inputs of one linear layer (bf16-representable), with non-zero starting dw and db so the
// accumulation is visible.
struct Inputs {
  std::vector<float> x, w, b, dy, dw0, db0;
  Inputs(const Shape3& s, uint64_t seed)
      : x(rounded(random_vec<float>(s.M * s.K, seed, -1, 1))),
        w(rounded(random_vec<float>(s.N * s.K, seed + 1, -1, 1))),
        b(rounded(random_vec<float>(s.N, seed + 2, -1, 1))),
        dy(rounded(random_vec<float>(s.M * s.N, seed + 3, -1, 1))),
        dw0(random_vec<float>(s.N * s.K, seed + 4, -1, 1)),
        db0(random_vec<float>(s.N, seed + 5, -1, 1)) {}
};

// What the bf16 layer computes on the GPU: y (bf16, bias epilogue), y32 (fp32 output and bias),
// dx, dw after one backward (dw0 + dy^T x) and after a second (dw0 + 2 dy^T x), db.
struct Outputs {
  std::vector<uint8_t> y, y32, dx, dw1, dw2, db;
  std::vector<float> fy, fy32, fdx, fdw1, fdb;
};

Outputs run_bf16(Gemm& gemm, const Shape3& s, const Inputs& in) {
  const int64_t M = s.M, N = s.N, K = s.K;
  DeviceBuffer<bf16> gx(in.x), gw(in.w), gb(in.b), gdy(in.dy), gy(M * N), gdx(M * K);
  DeviceBuffer<float> gb32(in.b), gy32(M * N), gdw(in.dw0), gdb(in.db0);
  linear_forward(gemm, gx.get(), gw, gb, gy.get(), M, N, K, nullptr);
  linear_forward(gemm, gx.get(), gw.get(), gb32.get(), gy32.get(), M, N, K, nullptr);
  linear_backward(gemm, gdy.get(), gx, gw, gdx, gdw, gdb, M, N, K, nullptr);
  Outputs o;
  o.y = gy.bytes(), o.y32 = gy32.bytes(), o.dx = gdx.bytes(), o.dw1 = gdw.bytes(), o.db = gdb.bytes();
  o.fy = gy.download(), o.fy32 = gy32.download(), o.fdx = gdx.download(), o.fdw1 = gdw.download();
  o.fdb = gdb.download();
  linear_backward(gemm, gdy.get(), gx, gw, nullptr, gdw, nullptr, M, N, K, nullptr);
  o.dw2 = gdw.bytes();
  return o;
}

void expect_same_bits(const Outputs& on, const Outputs& off, const Shape3& s) {
  SCOPED_TRACE(testing::Message() << s.M << "x" << s.N << "x" << s.K);
  EXPECT_TRUE(on.y == off.y) << "forward (bf16, bias epilogue)";
  EXPECT_TRUE(on.y32 == off.y32) << "forward (fp32 out)";
  EXPECT_TRUE(on.dx == off.dx) << "dgrad";
  EXPECT_TRUE(on.dw1 == off.dw1) << "wgrad, first accumulation";
  EXPECT_TRUE(on.dw2 == off.dw2) << "wgrad, second accumulation";
  EXPECT_TRUE(on.db == off.db) << "bias grad";
}

// Small and odd shapes, and llama-like ones where cuBLASLt offers several kernels (split-K among
// them, which the guard must reject when its sums differ).
TEST_F(GpuGemmTune, Bf16BitIdenticalToUntuned) {
  Gemm on, off;
  on.set_tuning(true);
  off.set_tuning(false);
  uint64_t seed = 100;
  for (const Shape3 s : {Shape3{100, 130, 70}, Shape3{256, 512, 384}, Shape3{1024, 3072, 2048},
                         Shape3{2048, 2048, 8192}, Shape3{512, 16384, 2048}}) {
    const Inputs in(s, seed += 10);
    expect_same_bits(run_bf16(on, s, in), run_bf16(off, s, in), s);
  }
  EXPECT_GT(on.tuned_shapes(), 0);  // the random inputs are informative: tuning ran
  EXPECT_EQ(off.tuned_shapes(), 0);
}

TEST_F(GpuGemmTune, Fp32BitIdenticalToUntuned) {
  Gemm on, off;
  on.set_tuning(true);
  off.set_tuning(false);
  for (const Shape3 s : {Shape3{70, 50, 90}, Shape3{512, 768, 1024}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    const auto x = random_vec<float>(M * K, 31), w = random_vec<float>(N * K, 32), b = random_vec<float>(N, 33);
    const auto dy = random_vec<float>(M * N, 34), dw0 = random_vec<float>(N * K, 35);
    std::vector<std::vector<uint8_t>> res[2];
    for (int t = 0; t < 2; ++t) {
      Gemm& g = t == 0 ? on : off;
      DeviceBuffer<float> gx(x), gw(w), gb(b), gdy(dy), gy(M * N), gdx(M * K), gdw(dw0);
      linear_forward(g, gx.get(), gw.get(), gb.get(), gy.get(), M, N, K, nullptr);
      linear_backward(g, gdy.get(), gx.get(), gw.get(), gdx.get(), gdw.get(), nullptr, M, N, K, nullptr);
      res[t] = {gy.bytes(), gdx.bytes(), gdw.bytes()};
    }
    EXPECT_TRUE(res[0] == res[1]) << M << "x" << N << "x" << K;
  }
  EXPECT_GT(on.tuned_shapes(), 0);
}

// The tuned Gemm against the CPU (the tolerances of cuda_gemm_test.cpp). dw is checked after one
// backward: had tuning accumulated its candidates' results into dw, it would be off by O(1).
TEST_F(GpuGemmTune, TunedMatchesCpu) {
  Gemm gemm;
  gemm.set_tuning(true);
  uint64_t seed = 200;
  for (const Shape3 s : {Shape3{96, 160, 72}, Shape3{256, 512, 384}, Shape3{100, 130, 70}, Shape3{512, 1024, 768}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    const Inputs in(s, seed += 10);
    std::vector<float> y(M * N), dx(M * K), dw = in.dw0, db = in.db0;
    cpu::linear_forward(in.x.data(), in.w.data(), in.b.data(), y.data(), M, N, K);
    cpu::linear_backward(in.dy.data(), in.x.data(), in.w.data(), dx.data(), dw.data(), db.data(), M, N, K);
    const Outputs o = run_bf16(gemm, s, in);
    const double ey = rel_l2(o.fy, y), ey32 = rel_l2(o.fy32, y), edx = rel_l2(o.fdx, dx);
    const double edw = rel_l2(o.fdw1, dw), edb = rel_l2(o.fdb, db);
    std::printf("tuned bf16 gemm %lldx%lldx%lld: y %.2e y32 %.2e dx %.2e dw %.2e db %.2e\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), ey, ey32, edx, edw, edb);
    EXPECT_LT(ey, 1e-2);
    EXPECT_LT(ey32, 1e-4);
    EXPECT_LT(edx, 1e-2);
    EXPECT_LT(edw, 1e-4);
    EXPECT_LT(edb, 1e-5);
  }
}

// The MoE experts' row counts change with the routing: counts in one bucket (1537..1792 rows) share
// one plan per GEMM (forward bf16, forward fp32, dgrad, wgrad: 4), each still matches the CPU,
// and a count gives the same bits whether or not other counts ran before it (the plan depends
// only on the shape, so resumed runs keep their bits).
TEST_F(GpuGemmTune, RaggedRowCountsShareABucketPlan) {
  Gemm gemm, fresh;
  uint64_t seed = 300;
  for (const int64_t M : {1537, 1600, 1701, 1792}) {
    const Shape3 s{M, 512, 384};
    const Inputs in(s, seed += 10);
    std::vector<float> y(s.M * s.N), dx(s.M * s.K), dw = in.dw0, db = in.db0;
    cpu::linear_forward(in.x.data(), in.w.data(), in.b.data(), y.data(), s.M, s.N, s.K);
    cpu::linear_backward(in.dy.data(), in.x.data(), in.w.data(), dx.data(), dw.data(), db.data(), s.M, s.N, s.K);
    const Outputs o = run_bf16(gemm, s, in);
    EXPECT_LT(rel_l2(o.fy, y), 1e-2) << M;
    EXPECT_LT(rel_l2(o.fdx, dx), 1e-2) << M;
    EXPECT_LT(rel_l2(o.fdw1, dw), 1e-4) << M;
    if (M == 1701) {
      EXPECT_TRUE(run_bf16(fresh, s, in).y == o.y) << "the plan of 1701 rows depends on history";
    }
  }
  EXPECT_EQ(gemm.plans(), 4);
}

// Zero weights make every summation order agree, so the guard could not reject anything: tuning
// waits for informative inputs, and after three such calls keeps the default for good.
TEST_F(GpuGemmTune, PutsOffTuningOnZeroInputs) {
  const int64_t M = 512, N = 1024, K = 768;
  const auto x = random_vec<float>(M * K, 41), w = random_vec<float>(N * K, 42);
  DeviceBuffer<bf16> gx(x), gzero(std::vector<float>(N * K, 0.f)), gw(w), gy(M * N);
  const bf16* nob = nullptr;
  {
    Gemm gemm;
    gemm.set_tuning(true);
    linear_forward(gemm, gx.get(), gzero, nob, gy.get(), M, N, K, nullptr);
    EXPECT_EQ(gemm.tuned_shapes(), 0);
    for (float v : gy.download()) ASSERT_EQ(v, 0.f);
    linear_forward(gemm, gx.get(), gw, nob, gy.get(), M, N, K, nullptr);  // same shape and alignment: same plan
    EXPECT_EQ(gemm.tuned_shapes(), 1);
  }
  {
    Gemm gemm;
    gemm.set_tuning(true);
    for (int i = 0; i < 3; ++i) linear_forward(gemm, gx.get(), gzero, nob, gy.get(), M, N, K, nullptr);
    linear_forward(gemm, gx.get(), gw, nob, gy.get(), M, N, K, nullptr);
    EXPECT_EQ(gemm.tuned_shapes(), 0);
  }
}

// db += column sums of dy, against a host sum in double: few and many columns, one row chunk
// and more chunks than the finishing kernel's 16 chunk groups (M = 9477 is 38 chunks of 256
// rows, the last partial). Run twice from the same db: the same bits.
TEST_F(GpuGemmTune, ColumnSumMatchesHost) {
  Gemm gemm;
  const Shape3 shapes[] = {{1, 1, 8}, {3, 7, 8}, {257, 33, 8}, {9477, 2053, 8}, {8192, 64, 8}};
  for (const Shape3 s : shapes) {
    const int64_t M = s.M, N = s.N;
    const auto dy = random_vec<float>(M * N, 51), db0 = random_vec<float>(N, 52);
    std::vector<float> want(N);
    for (int64_t j = 0; j < N; ++j) {
      double acc = db0[j];
      for (int64_t i = 0; i < M; ++i) acc += dy[i * N + j];
      want[j] = static_cast<float>(acc);
    }
    DeviceBuffer<float> gdy(dy);
    std::vector<std::vector<uint8_t>> runs;
    for (int r = 0; r < 2; ++r) {
      DeviceBuffer<float> gdb(db0);
      linear_backward(gemm, gdy.get(), nullptr, nullptr, nullptr, nullptr, gdb.get(), M, N, s.K, nullptr);
      EXPECT_LT(rel_l2(gdb.download(), want), 1e-5) << M << "x" << N;
      runs.push_back(gdb.bytes());
    }
    EXPECT_TRUE(runs[0] == runs[1]) << M << "x" << N;
    // bf16 storage: the same sums over the rounded values.
    const auto dyh = rounded(dy);
    for (int64_t j = 0; j < N; ++j) {
      double acc = db0[j];
      for (int64_t i = 0; i < M; ++i) acc += dyh[i * N + j];
      want[j] = static_cast<float>(acc);
    }
    DeviceBuffer<bf16> gdyh(dyh);
    DeviceBuffer<float> gdb(db0);
    linear_backward(gemm, gdyh.get(), nullptr, nullptr, nullptr, nullptr, gdb.get(), M, N, s.K, nullptr);
    EXPECT_LT(rel_l2(gdb.download(), want), 1e-5) << "bf16 " << M << "x" << N;
  }
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
