// CUDA elementwise, norm, RoPE, embedding, cross-entropy and optimizer kernels against the CPU
// reference: fp32 storage with fp32 tolerances, bf16 storage with bf16 tolerances (inputs rounded
// to bf16 for the reference), bit-exact where the arithmetic is the same (dropout, casts, AdamW),
// and run-to-run determinism of the reductions.
#ifdef MT_HAVE_CUDA

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rounded;
using test::rel_l2;

std::vector<float> plus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
  return r;
}

// A device copy of `v` starting one element past a 16-byte boundary (at get() + 1), so kernels
// that check alignment take their scalar path on it.
template <typename T>
DeviceBuffer<T> misaligned(const std::vector<float>& v) {
  std::vector<float> padded(v.size() + 1, 0.f);
  std::copy(v.begin(), v.end(), padded.begin() + 1);
  return DeviceBuffer<T>(padded);
}
template <typename T>
std::vector<float> download_misaligned(const DeviceBuffer<T>& b) {
  auto v = b.download();
  std::vector<float> out(v.begin() + 1, v.end());
  return out;
}

// ---- norms
template <typename T>
void check_rmsnorm(int64_t rows, int64_t dim, double tol) {
  const bool bf = std::is_same_v<T, bf16>;
  auto prep = [&](std::vector<float> v) { return bf ? rounded(std::move(v)) : v; };
  const auto x = prep(random_vec<float>(rows * dim, 1, -2, 2)), res = prep(random_vec<float>(rows * dim, 2, -2, 2));
  const auto w = prep(random_vec<float>(dim, 3, 0.5, 1.5)), dy = prep(random_vec<float>(rows * dim, 4, -1, 1));
  const auto dadd = prep(random_vec<float>(rows * dim, 5, -1, 1));
  const auto dw0 = random_vec<float>(dim, 6, -1, 1);
  const auto sum = prep(plus(x, res));
  std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dw = dw0;
  cpu::rmsnorm_forward(sum.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5f);
  cpu::rmsnorm_backward(dy.data(), sum.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, dim);
  const auto dx_full = plus(dx, dadd);

  DeviceBuffer<T> gx(x), gres(res), gsum(rows * dim), gw(w), gy(rows * dim), gy2(rows * dim), gdy(dy), gdx(rows * dim),
      gdadd(dadd);
  DeviceBuffer<float> grstd(rows), grstd2(rows), gdw(dw0);
  add_rmsnorm_forward(gx.get(), gres.get(), gsum.get(), gw.get(), gy.get(), grstd.get(), rows, dim, 1e-5f, nullptr);
  rmsnorm_forward(gsum.get(), gw.get(), gy2.get(), grstd2.get(), rows, dim, 1e-5f, nullptr);
  rmsnorm_backward(gdy.get(), gsum.get(), gw.get(), grstd.get(), gdx.get(), gdw.get(), rows, dim, nullptr, gdadd.get());
  const double es = rel_l2(gsum.download(), sum), ey = rel_l2(gy.download(), y), er = rel_l2(grstd.download(), rstd);
  const double edx = rel_l2(gdx.download(), dx_full), edw = rel_l2(gdw.download(), dw);
  std::printf("rmsnorm %s %lldx%lld: sum %.2e y %.2e rstd %.2e dx %.2e dw %.2e\n", bf ? "bf16" : "fp32",
              static_cast<long long>(rows), static_cast<long long>(dim), es, ey, er, edx, edw);
  EXPECT_LT(es, bf ? 1e-7 : 1e-6);
  EXPECT_LT(ey, tol);
  EXPECT_LT(er, 1e-5);
  EXPECT_LT(edx, tol);
  EXPECT_LT(edw, bf ? 1e-4 : 1e-5);
  EXPECT_TRUE(test::bit_equal(gy.download(), gy2.download()));  // fused add == add then norm
}

template <typename T>
void check_layernorm(int64_t rows, int64_t dim, double tol) {
  const bool bf = std::is_same_v<T, bf16>;
  auto prep = [&](std::vector<float> v) { return bf ? rounded(std::move(v)) : v; };
  const auto x = prep(random_vec<float>(rows * dim, 11, 1, 3)), res = prep(random_vec<float>(rows * dim, 12, -2, 2));
  const auto w = prep(random_vec<float>(dim, 13, 0.5, 1.5)), b = prep(random_vec<float>(dim, 14, -1, 1));
  const auto dy = prep(random_vec<float>(rows * dim, 15, -1, 1));
  const auto dw0 = random_vec<float>(dim, 16, -1, 1), db0 = random_vec<float>(dim, 17, -1, 1);
  const auto sum = prep(plus(x, res));
  std::vector<float> y(rows * dim), mean(rows), rstd(rows), dx(rows * dim), dw = dw0, db = db0;
  cpu::layernorm_forward(sum.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
  cpu::layernorm_backward(dy.data(), sum.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(),
                          rows, dim);
  DeviceBuffer<T> gx(x), gres(res), gsum(rows * dim), gw(w), gb(b), gy(rows * dim), gdy(dy), gdx(rows * dim);
  DeviceBuffer<float> gmean(rows), grstd(rows), gdw(dw0), gdb(db0);
  add_layernorm_forward(gx.get(), gres.get(), gsum.get(), gw.get(), gb.get(), gy.get(), gmean.get(), grstd.get(), rows,
                        dim, 1e-5f, nullptr);
  layernorm_backward(gdy.get(), gsum.get(), gw.get(), gmean.get(), grstd.get(), gdx.get(), gdw.get(), gdb.get(), rows,
                     dim, nullptr);
  const double ey = rel_l2(gy.download(), y), em = rel_l2(gmean.download(), mean);
  const double er = rel_l2(grstd.download(), rstd), edx = rel_l2(gdx.download(), dx);
  const double edw = rel_l2(gdw.download(), dw), edb = rel_l2(gdb.download(), db);
  std::printf("layernorm %s %lldx%lld: y %.2e mean %.2e rstd %.2e dx %.2e dw %.2e db %.2e\n", bf ? "bf16" : "fp32",
              static_cast<long long>(rows), static_cast<long long>(dim), ey, em, er, edx, edw, edb);
  EXPECT_LT(ey, tol);
  EXPECT_LT(em, 1e-5);
  EXPECT_LT(er, 1e-5);
  EXPECT_LT(edx, tol);
  EXPECT_LT(edw, bf ? 1e-4 : 1e-5);
  EXPECT_LT(edb, 1e-5);
}

TEST(GpuNorms, RmsNormMatchesCpu) {
  check_rmsnorm<float>(37, 200, 1e-5);
  check_rmsnorm<float>(70, 75, 1e-5);
  check_rmsnorm<float>(65, 2048, 1e-5);
  check_rmsnorm<bf16>(65, 2048, 1e-2);
  check_rmsnorm<bf16>(33, 100, 1e-2);
}

TEST(GpuNorms, LayerNormMatchesCpu) {
  check_layernorm<float>(37, 200, 1e-5);
  check_layernorm<float>(70, 75, 1e-5);
  check_layernorm<bf16>(65, 1024, 1e-2);
}

TEST(GpuNorms, Deterministic) {
  const int64_t rows = 1000, dim = 1536;
  const auto x = random_vec<float>(rows * dim, 1), dy = random_vec<float>(rows * dim, 2), w = random_vec<float>(dim, 3);
  std::vector<std::vector<uint8_t>> runs;
  for (int r = 0; r < 2; ++r) {
    DeviceBuffer<bf16> gx(x), gdy(dy), gw(w), gy(rows * dim), gdx(rows * dim);
    DeviceBuffer<float> grstd(rows), gdw(std::vector<float>(dim, 0.f));
    rmsnorm_forward(gx.get(), gw.get(), gy.get(), grstd.get(), rows, dim, 1e-6f, nullptr);
    rmsnorm_backward(gdy.get(), gx.get(), gw.get(), grstd.get(), gdx.get(), gdw.get(), rows, dim, nullptr);
    auto all = gy.bytes();
    for (const auto& p : {gdx.bytes(), gdw.bytes()}) all.insert(all.end(), p.begin(), p.end());
    runs.push_back(all);
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

// ---- RoPE
TEST(GpuRope, MatchesCpu) {
  const int64_t B = 2, H = 3, S = 50, D = 32, rot = 16;
  std::vector<float> cs(S * rot / 2), sn(S * rot / 2);
  cpu::rope_tables(S, rot, 10000.0, cs.data(), sn.data());
  DeviceBuffer<float> gcs(S * rot / 2), gsn(S * rot / 2);
  rope_tables(S, rot, 10000.0, gcs.get(), gsn.get(), nullptr);
  EXPECT_LT(test::max_rel_err(gcs.download(), cs), 1e-6);
  EXPECT_LT(test::max_rel_err(gsn.download(), sn), 1e-6);
  const auto x = random_vec<float>(B * H * S * D, 5);
  auto y = x;
  cpu::rope_forward(y.data(), cs.data(), sn.data(), B, H, S, D, rot);
  DeviceBuffer<float> gx(x);
  DeviceBuffer<float> gcs2(cs), gsn2(sn);
  rope_forward(gx.get(), gcs2.get(), gsn2.get(), B, H, S, D, rot, nullptr);
  EXPECT_LT(rel_l2(gx.download(), y), 1e-6);
  rope_backward(gx.get(), gcs2.get(), gsn2.get(), B, H, S, D, rot, nullptr);
  EXPECT_LT(rel_l2(gx.download(), x), 1e-6);  // the inverse rotation
  DeviceBuffer<bf16> hx(x);
  rope_forward(hx.get(), gcs2.get(), gsn2.get(), B, H, S, D, rot, nullptr);
  EXPECT_LT(rel_l2(hx.download(), y), 1e-2);
}

// The vector path (16-byte groups of pairs: half % Vec<T>::N == 0, aligned rows) and the scalar
// path (misaligned rows, or odd halves) give the CPU's result and the same bits as each other.
template <typename T>
void check_rope_paths(int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot) {
  const bool bf = std::is_same_v<T, bf16>;
  const int64_t half = rot / 2, n = B * H * S * D;
  std::vector<float> cs(S * half), sn(S * half);
  cpu::rope_tables(S, rot, 10000.0, cs.data(), sn.data());
  auto x = random_vec<float>(n, 21, -2, 2);
  if (bf) x = rounded(x);
  auto want = x, back = x;
  cpu::rope_forward(want.data(), cs.data(), sn.data(), B, H, S, D, rot);
  DeviceBuffer<float> gcs(cs), gsn(sn);
  DeviceBuffer<T> ga(x);
  DeviceBuffer<T> gb = misaligned<T>(x);
  rope_forward(ga.get(), gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
  rope_forward(gb.get() + 1, gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
  const auto ya = ga.download(), yb = download_misaligned(gb);
  const double tol = bf ? 1e-2 : 1e-6;
  std::printf("rope %s B=%lld H=%lld S=%lld D=%lld rot=%lld: rel %.2e max %.2e\n", bf ? "bf16" : "fp32",
              static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S),
              static_cast<long long>(D), static_cast<long long>(rot), rel_l2(ya, want), test::max_rel_err(ya, want));
  EXPECT_LT(rel_l2(ya, want), tol);
  EXPECT_LT(test::max_rel_err(ya, want), bf ? 2e-2 : 1e-5);
  EXPECT_TRUE(test::bit_equal(ya, yb)) << "vector and scalar paths differ";
  for (int64_t r = 0; r < B * H * S; ++r)  // columns from rot on are untouched
    for (int64_t j = rot; j < D; ++j) ASSERT_EQ(ya[r * D + j], x[r * D + j]) << r << "," << j;
  rope_backward(ga.get(), gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
  rope_backward(gb.get() + 1, gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
  const auto xa = ga.download(), xb = download_misaligned(gb);
  EXPECT_LT(rel_l2(xa, x), bf ? 2e-2 : 1e-6);  // the inverse rotation
  EXPECT_TRUE(test::bit_equal(xa, xb)) << "vector and scalar paths differ (backward)";
}

TEST(GpuRope, VectorAndScalarPathsMatchCpu) {
  for (auto [D, rot] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {64, 32}, {128, 64}, {40, 24}, {24, 12},
                                                                 {18, 10}}) {
    check_rope_paths<float>(2, 3, 37, D, rot);  // fp32 vector path when half % 4 == 0
    check_rope_paths<bf16>(2, 3, 37, D, rot);   // bf16 vector path when half % 8 == 0
  }
  // More pair groups per row than threads per block: fp32 vector (320 groups), bf16 scalar (515).
  check_rope_paths<float>(1, 2, 5, 2560, 2560);
  check_rope_paths<bf16>(1, 2, 5, 1030, 1030);
}

// More heads than the grid's y extent: each thread loops over several heads (with the cos/sin
// values it loaded once), on the vector and on the scalar path.
TEST(GpuRope, HeadLoopCoversAllRows) {
  check_rope_paths<bf16>(4, 600, 3, 64, 64);
  check_rope_paths<float>(4, 600, 3, 64, 64);
  check_rope_paths<float>(1, 5000, 50, 12, 12);
}

// ---- activations and dropout
// Shapes: narrow rows; several of a thread's groups past the row end; more than one block per
// row (8200 > 256 threads x 4 groups x 8); an odd width (the scalar path).
void check_swiglu(int64_t rows, int64_t F) {
  const auto x = random_vec<float>(rows * 2 * F, 1, -4, 4), dy = random_vec<float>(rows * F, 2);
  std::vector<float> y(rows * F), dx(rows * 2 * F);
  cpu::swiglu_forward(x.data(), y.data(), rows, F);
  cpu::swiglu_backward(dy.data(), x.data(), dx.data(), rows, F);
  {
    DeviceBuffer<float> gx(x), gdy(dy), gy(rows * F), gdx(rows * 2 * F);
    swiglu_forward(gx.get(), gy.get(), rows, F, nullptr);
    swiglu_backward(gdy.get(), gx.get(), gdx.get(), rows, F, nullptr);
    EXPECT_LT(rel_l2(gy.download(), y), 1e-6) << rows << "x" << F;
    EXPECT_LT(rel_l2(gdx.download(), dx), 1e-6) << rows << "x" << F;
  }
  const auto xr = rounded(x), dyr = rounded(dy);
  std::vector<float> yr(rows * F), dxr(rows * 2 * F);
  cpu::swiglu_forward(xr.data(), yr.data(), rows, F);
  cpu::swiglu_backward(dyr.data(), xr.data(), dxr.data(), rows, F);
  DeviceBuffer<bf16> gx(xr), gdy(dyr), gy(rows * F), gdx(rows * 2 * F);
  swiglu_forward(gx.get(), gy.get(), rows, F, nullptr);
  swiglu_backward(gdy.get(), gx.get(), gdx.get(), rows, F, nullptr);
  EXPECT_LT(rel_l2(gy.download(), yr), 1e-2) << rows << "x" << F;
  EXPECT_LT(rel_l2(gdx.download(), dxr), 1e-2) << rows << "x" << F;
}

TEST(GpuActivations, SwigluGeluMatchCpu) {
  for (auto [rows, F] : {std::pair<int64_t, int64_t>{33, 120}, {5, 5000}, {3, 8200}, {2, 20001}}) check_swiglu(rows, F);
  const int64_t n = 4099;
  for (bool tanh_approx : {false, true}) {
    const auto gxv = random_vec<float>(n, 7, -5, 5), gdyv = random_vec<float>(n, 8);
    std::vector<float> gy(n), gdx(n);
    cpu::gelu_forward(gxv.data(), gy.data(), n, tanh_approx);
    cpu::gelu_backward(gdyv.data(), gxv.data(), gdx.data(), n, tanh_approx);
    DeviceBuffer<float> dx(gxv), ddy(gdyv), dy_out(n), ddx(n);
    gelu_forward(dx.get(), dy_out.get(), n, tanh_approx, nullptr);
    gelu_backward(ddy.get(), dx.get(), ddx.get(), n, tanh_approx, nullptr);
    EXPECT_LT(rel_l2(dy_out.download(), gy), 1e-6) << tanh_approx;
    EXPECT_LT(rel_l2(ddx.download(), gdx), 1e-6) << tanh_approx;
    DeviceBuffer<bf16> hx(gxv), hy(n);
    gelu_forward(hx.get(), hy.get(), n, tanh_approx, nullptr);
    EXPECT_LT(rel_l2(hy.download(), gy), 1e-2);
  }
}

TEST(GpuDropout, BitExactWithCpu) {
  const int64_t n = 10001;
  const uint64_t seed = 4242, offset = (uint64_t{1} << 35) + 17;
  const auto x = random_vec<float>(n, 3);
  std::vector<float> y(n), dx(n);
  cpu::dropout_forward(x.data(), y.data(), n, 0.3f, seed, offset);
  cpu::dropout_backward(x.data(), dx.data(), n, 0.3f, seed, offset);
  DeviceBuffer<float> gx(x), gy(n), gdx(n);
  dropout_forward(gx.get(), gy.get(), n, 0.3f, seed, offset, nullptr);
  dropout_backward(gx.get(), gdx.get(), n, 0.3f, seed, offset, nullptr);
  EXPECT_TRUE(test::bit_equal(gy.download(), y));
  EXPECT_TRUE(test::bit_equal(gdx.download(), dx));
}

// bf16 (one 16-byte vector = two Philox blocks per thread) and the scalar path (misaligned
// pointers): still the CPU's bits.
TEST(GpuDropout, VectorAndScalarPathsBitExact) {
  const int64_t n = 10001;
  const uint64_t seed = 99, offset = 12345;
  const auto x = rounded(random_vec<float>(n, 4));
  std::vector<float> y(n), y1(n - 1);
  cpu::dropout_forward(x.data(), y.data(), n, 0.25f, seed, offset);
  cpu::dropout_forward(x.data() + 1, y1.data(), n - 1, 0.25f, seed, offset);  // what x + 1 gives
  DeviceBuffer<bf16> hx(x), hy(n);
  dropout_forward(hx.get(), hy.get(), n, 0.25f, seed, offset, nullptr);
  EXPECT_TRUE(test::bit_equal(hy.download(), rounded(y)));
  DeviceBuffer<bf16> hy2(n - 1);
  dropout_forward(hx.get() + 1, hy2.get(), n - 1, 0.25f, seed, offset, nullptr);  // scalar path
  EXPECT_TRUE(test::bit_equal(hy2.download(), rounded(y1)));
  DeviceBuffer<float> gx(x), gy(n - 1);
  dropout_forward(gx.get() + 1, gy.get(), n - 1, 0.25f, seed, offset, nullptr);  // fp32 scalar path
  EXPECT_TRUE(test::bit_equal(gy.download(), y1));
}

// ---- embedding
TEST(GpuEmbedding, MatchesCpuAndIsDeterministic) {
  const int64_t V = 97, dim = 72, n = 3000;
  const auto table = random_vec<float>(V * dim, 1), dout = random_vec<float>(n * dim, 2);
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + i / 3) % (V - 10));  // many repeats
  std::vector<float> out(n * dim), dtable = random_vec<float>(V * dim, 3);
  const auto dtable0 = dtable;
  cpu::embedding_forward(ids.data(), table.data(), out.data(), n, dim);
  cpu::embedding_backward(ids.data(), dout.data(), dtable.data(), n, dim);
  DeviceBuffer<int32_t> gids(ids);
  DeviceBuffer<float> gtable(table), gout(n * dim), gdout(dout);
  embedding_forward(gids.get(), gtable.get(), gout.get(), n, dim, nullptr);
  EXPECT_TRUE(test::bit_equal(gout.download(), out));
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    DeviceBuffer<float> gdt(dtable0);
    embedding_backward(gids.get(), gdout.get(), gdt.get(), n, dim, nullptr);
    runs.push_back(gdt.download());
  }
  EXPECT_LT(rel_l2(runs[0], dtable), 1e-6);
  EXPECT_TRUE(test::bit_equal(runs[0], runs[1]));
  const auto tr = rounded(table), dr = rounded(dout);
  DeviceBuffer<bf16> htable(tr), hout(n * dim), hdout(dr);
  embedding_forward(gids.get(), htable.get(), hout.get(), n, dim, nullptr);
  std::vector<float> outr(n * dim), dtr = dtable0;
  cpu::embedding_forward(ids.data(), tr.data(), outr.data(), n, dim);
  cpu::embedding_backward(ids.data(), dr.data(), dtr.data(), n, dim);
  EXPECT_TRUE(test::bit_equal(hout.download(), outr));
  DeviceBuffer<float> gdt(dtable0);
  embedding_backward(gids.get(), hdout.get(), gdt.get(), n, dim, nullptr);
  EXPECT_LT(rel_l2(gdt.download(), dtr), 1e-6);
}

// ---- cross-entropy
template <typename T>
void check_ce(int64_t N, int64_t V, int64_t valid_v, double tol) {
  const bool bf = std::is_same_v<T, bf16>;
  auto logits = random_vec<float>(N * V, 1, -8, 8);
  if (bf) logits = rounded(logits);
  std::vector<int32_t> tg(N);
  for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 104729) % valid_v);
  const auto dloss = random_vec<float>(N, 2, 0.5, 1.5);
  std::vector<float> loss(N), lse(N), dlog(N * V);
  cpu::cross_entropy_forward(logits.data(), tg.data(), loss.data(), lse.data(), N, V, valid_v);
  cpu::cross_entropy_backward(logits.data(), tg.data(), lse.data(), dloss.data(), dlog.data(), N, V, valid_v);
  DeviceBuffer<T> gl(logits);
  DeviceBuffer<int32_t> gt(tg);
  DeviceBuffer<float> gloss(N), glse(N), gdl(dloss);
  cross_entropy_forward(gl.get(), gt.get(), gloss.get(), glse.get(), N, V, valid_v, nullptr);
  const double el = rel_l2(gloss.download(), loss), es = rel_l2(glse.download(), lse);
  cross_entropy_backward(gl.get(), gt.get(), glse.get(), gdl.get(), gl.get(), N, V, valid_v, nullptr);  // in place
  const double ed = rel_l2(gl.download(), dlog);
  std::printf("cross entropy %s N=%lld V=%lld: loss %.2e lse %.2e dlogits %.2e\n", bf ? "bf16" : "fp32",
              static_cast<long long>(N), static_cast<long long>(V), el, es, ed);
  EXPECT_LT(el, 1e-5);
  EXPECT_LT(es, 1e-5);
  EXPECT_LT(ed, tol);
}

TEST(GpuCrossEntropy, MatchesCpu) {
  check_ce<float>(64, 1000, 990, 1e-5);
  check_ce<float>(7, 333, 333, 1e-5);
  check_ce<bf16>(16, 128256, 128000, 1e-2);
}

// ---- casts and elementwise
TEST(GpuElementwise, CastsAddScale) {
  const int64_t n = 1027;
  auto x = random_vec<float>(n, 1, -100, 100);
  x[0] = 1.0f + 1.0f / 256;  // a tie: rounds to even
  DeviceBuffer<float> gx(x), back(n);
  DeviceBuffer<bf16> h(n);
  cast(gx.get(), h.get(), n, nullptr);
  cast(h.get(), back.get(), n, nullptr);
  EXPECT_TRUE(test::bit_equal(back.download(), rounded(x)));
  const auto y = random_vec<float>(n, 2);
  DeviceBuffer<float> gy(y);
  add_inplace(gy.get(), gx.get(), n, nullptr);
  scale_inplace(gy.get(), 0.5f, n, nullptr);
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = (y[i] + x[i]) * 0.5f;
  EXPECT_TRUE(test::bit_equal(gy.download(), want));
  DeviceBuffer<float> acc(y);
  add_inplace(acc.get(), h.get(), n, nullptr);
  const auto xr = rounded(x);
  for (int64_t i = 0; i < n; ++i) want[i] = y[i] + xr[i];
  EXPECT_TRUE(test::bit_equal(acc.download(), want));
}

// Casts and the fp32 += bf16 add move groups of 8 (one bf16 vector, two fp32 vectors) when both
// pointers are 16-byte aligned, scalars otherwise: both must give the same bits, ties, infinities,
// signed zeros and NaNs included.
TEST(GpuElementwise, CastAndMixedAddVectorAndScalarPathsAgree) {
  for (int64_t n : {int64_t{8}, int64_t{13}, int64_t{4099}, int64_t{1} << 20}) {
    auto x = random_vec<float>(n, 31, -1000, 1000);
    const float specials[] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -0.0f, INFINITY, -INFINITY, 3.0e38f};
    for (int64_t i = 0; i < 6; ++i) x[i * 3 % n] = specials[i];
    const auto xr = rounded(x);
    // fp32 -> bf16
    DeviceBuffer<float> fa(x);
    DeviceBuffer<float> fb = misaligned<float>(x);
    DeviceBuffer<bf16> ha(n), hb(n + 1);
    cast(fa.get(), ha.get(), n, nullptr);
    cast(fb.get() + 1, hb.get() + 1, n, nullptr);
    EXPECT_TRUE(test::bit_equal(ha.download(), xr)) << n;
    EXPECT_TRUE(test::bit_equal(download_misaligned(hb), xr)) << n;
    // bf16 -> fp32
    DeviceBuffer<float> ba(n), bb(n + 1);
    cast(ha.get(), ba.get(), n, nullptr);
    cast(hb.get() + 1, bb.get() + 1, n, nullptr);
    EXPECT_TRUE(test::bit_equal(ba.download(), xr)) << n;
    EXPECT_TRUE(test::bit_equal(download_misaligned(bb), xr)) << n;
    // fp32 += bf16
    const auto y = random_vec<float>(n, 32, -1000, 1000);
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = y[i] + xr[i];
    DeviceBuffer<float> aa(y);
    DeviceBuffer<float> ab = misaligned<float>(y);
    add_inplace(aa.get(), ha.get(), n, nullptr);
    add_inplace(ab.get() + 1, hb.get() + 1, n, nullptr);
    EXPECT_TRUE(test::bit_equal(aa.download(), want)) << n;
    EXPECT_TRUE(test::bit_equal(download_misaligned(ab), want)) << n;
  }
  // NaNs and subnormals: no CPU reference for these bits; the two GPU paths must agree.
  std::vector<float> x = random_vec<float>(64, 33);
  x[3] = NAN, x[17] = -NAN, x[40] = std::bit_cast<float>(0x7fa00001u);  // a signalling NaN
  x[8] = 1e-40f, x[9] = -3e-39f, x[63] = 1.5e-45f;
  DeviceBuffer<float> fa(x);
  DeviceBuffer<float> fb = misaligned<float>(x);
  DeviceBuffer<bf16> ha(64), hb(65);
  cast(fa.get(), ha.get(), 64, nullptr);
  cast(fb.get() + 1, hb.get() + 1, 64, nullptr);
  const auto ba = ha.bytes(), bb = hb.bytes();
  EXPECT_TRUE(std::equal(ba.begin(), ba.end(), bb.begin() + 2));
}

// ---- optimizer
// kernels/cpu/optimizer.cpp's AdamW update, restated (the GPU must match it bit for bit).
void adamw_ref(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m, std::vector<float>& v,
               bool decay, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const float step_size = static_cast<float>(h.lr / bc1), bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float df = decay ? static_cast<float>(1.0 - h.lr * h.weight_decay) : 1.0f;
  const float b1 = static_cast<float>(h.beta1), omb1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), omb2 = static_cast<float>(1.0 - h.beta2);
  const float eps = static_cast<float>(h.eps);
  for (size_t i = 0; i < p.size(); ++i) {
    const float gi = g[i];
    const float pi = p[i] * df;
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi - step_size * mi / denom;
  }
}

TEST(GpuOptim, AdamWBitExactMultiTensor) {
  const int count = 30;  // more than one launch's table
  std::vector<std::vector<float>> p, g, m, v;
  std::vector<DeviceBuffer<float>> dp, dg, dm, dv;
  std::vector<DeviceBuffer<bf16>> dout;
  std::vector<AdamWTensor> ts;
  for (int t = 0; t < count; ++t) {
    const int64_t n = 1 + (t * 7919) % 20000 + (t == 3 ? 100000 : 0);
    p.push_back(random_vec<float>(n, 100 + t));
    g.push_back(random_vec<float>(n, 200 + t, -0.1, 0.1));
    m.push_back(random_vec<float>(n, 300 + t, -0.01, 0.01));
    v.push_back(random_vec<float>(n, 400 + t, 0, 1e-4));
    dp.emplace_back(p.back()), dg.emplace_back(g.back()), dm.emplace_back(m.back()), dv.emplace_back(v.back());
    dout.emplace_back(static_cast<size_t>(n));
  }
  for (int t = 0; t < count; ++t)
    ts.push_back({dp[t].get(), dg[t].get(), dm[t].get(), dv[t].get(), dout[t].get(), static_cast<int64_t>(p[t].size()),
                  t % 3 != 0});
  AdamWHyper h;
  h.lr = static_cast<double>(3e-4f);
  h.weight_decay = 0.1;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    adamw_step(ts, h, nullptr);
    for (int t = 0; t < count; ++t) adamw_ref(p[t], g[t], m[t], v[t], t % 3 != 0, h);
  }
  for (int t = 0; t < count; ++t) {
    EXPECT_TRUE(test::bit_equal(dp[t].download(), p[t])) << "tensor " << t;
    EXPECT_TRUE(test::bit_equal(dm[t].download(), m[t])) << "tensor " << t;
    EXPECT_TRUE(test::bit_equal(dv[t].download(), v[t])) << "tensor " << t;
    EXPECT_TRUE(test::bit_equal(dout[t].download(), rounded(p[t]))) << "tensor " << t;
  }
}

TEST(GpuOptim, GradNormAndClip) {
  std::vector<std::vector<float>> g;
  std::vector<DeviceBuffer<float>> dg;
  std::vector<GradSpan> spans;
  double want = 0;
  for (int t = 0; t < 27; ++t) {
    g.push_back(random_vec<float>(1 + (t * 104729) % 50000, 500 + t));
    for (float x : g.back()) want += static_cast<double>(x) * x;
    dg.emplace_back(g.back());
  }
  for (int t = 0; t < 27; ++t) spans.push_back({dg[t].get(), static_cast<int64_t>(g[t].size())});
  const double got = grad_norm_squared_host(spans, nullptr), again = grad_norm_squared_host(spans, nullptr);
  EXPECT_NEAR(got, want, 1e-10 * want);
  EXPECT_EQ(got, again);
  DeviceBuffer<double> nsq(1);
  grad_norm_squared(spans, nsq.get(), nullptr);
  const double max_norm = 0.5 * std::sqrt(want);
  clip_grads(spans, nsq.get(), max_norm, nullptr);
  const float c = static_cast<float>(max_norm / (std::sqrt(got) + 1e-6));
  for (int t = 0; t < 27; ++t) {
    auto w = g[t];
    for (auto& x : w) x *= c;
    EXPECT_TRUE(test::bit_equal(dg[t].download(), w)) << t;
  }
}

// ---- allocator
TEST(GpuAllocator, StreamOrderedPoolBacksCudaTensors) {
  CudaAllocator* a = install_cuda_allocator(0, nullptr);
  ASSERT_EQ(cuda_allocator(), a);
  const size_t before = a->bytes_in_use();
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::BF16, Device::CUDA);
    EXPECT_EQ(t.device(), Device::CUDA);
    EXPECT_GE(a->bytes_in_use(), before + 2u * 1024 * 1024);
    MT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.nbytes(), a->stream()));
  }
  EXPECT_EQ(a->bytes_in_use(), before);
  EXPECT_GE(a->peak_bytes(), before + 2u * 1024 * 1024);
  // core's copy and zero hooks go through the backend.
  const std::vector<float> host = random_vec<float>(1000, 9);
  Tensor h = Tensor::from_vector(host, {1000});
  Tensor d = h.to_device(Device::CUDA);
  EXPECT_TRUE(test::bit_equal(d.to_device(Device::CPU).to_vector(), host));
  Tensor z = Tensor::zeros({1000}, DType::F32, Device::CUDA);
  EXPECT_TRUE(test::bit_equal(z.to_device(Device::CPU).to_vector(), std::vector<float>(1000, 0.f)));
  void* p1 = a->allocate(1 << 20);
  a->deallocate(p1, 1 << 20);
  void* p2 = a->allocate(1 << 20);  // served from the pool
  a->deallocate(p2, 1 << 20);
  MT_CUDA_CHECK(cudaStreamSynchronize(a->stream()));
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
