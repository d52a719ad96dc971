// The fp16 (IEEE half, --fp16) storage path of the CUDA kernels against the CPU reference, as the
// bf16 tests do it: inputs rounded to fp16 for the reference so only the arithmetic and the final
// rounding differ, with tolerances for fp16's 11-bit significand (unit roundoff 2^-11, about 8x
// finer than bf16's). Bit-exact where the arithmetic is the same (casts, embedding gather, the
// AdamW compute copy, unscaling). Also the Tensor-level attention wrapper (fp16 goes through the
// generic fp32 kernels) and the loss scaler's inf/nan check.
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rel_l2;

float round_h(float x) { return f16_to_f32(f32_to_f16(x)); }
std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_h(x);
  return v;
}
std::vector<float> plus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
  return r;
}

// A device fp16 buffer (DeviceBuffer holds the 16-bit patterns; the host side converts with
// core's f32_to_f16, round to nearest even).
class Half {
 public:
  explicit Half(size_t n) : b_(n) {}
  explicit Half(const std::vector<float>& v) : b_(bits(v)) {}
  f16* get() const { return reinterpret_cast<f16*>(b_.get()); }
  operator f16*() const { return get(); }
  std::vector<float> download() const {
    const auto h = b_.download();
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = f16_to_f32(h[i]);
    return out;
  }
  std::vector<uint16_t> raw() const { return b_.download(); }
  void fill_bytes(int v) { b_.fill_bytes(v); }

 private:
  static std::vector<uint16_t> bits(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_f16(v[i]);
    return b;
  }
  DeviceBuffer<uint16_t> b_;
};

class GpuFp16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  }
};

// ---- GEMM
TEST_F(GpuFp16, GemmMatchesCpu) {
  Gemm gemm;
  struct Shape3 {
    int64_t M, N, K;
  };
  for (const Shape3 sh : {Shape3{96, 160, 72}, Shape3{256, 512, 384}, Shape3{100, 130, 70}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    const auto x = rounded(random_vec<float>(M * K, 1, -1, 1)), w = rounded(random_vec<float>(N * K, 2, -1, 1));
    const auto b = rounded(random_vec<float>(N, 3, -1, 1)), dy = rounded(random_vec<float>(M * N, 4, -1, 1));
    const auto dw0 = random_vec<float>(N * K, 5, -1, 1), db0 = random_vec<float>(N, 6, -1, 1);
    std::vector<float> y(M * N), dx(M * K), dw = dw0, db = db0;
    cpu::linear_forward(x.data(), w.data(), b.data(), y.data(), M, N, K);
    cpu::linear_backward(dy.data(), x.data(), w.data(), dx.data(), dw.data(), db.data(), M, N, K);
    Half gx(x), gw(w), gb(b), gdy(dy), gy(M * N), gdx(M * K);
    DeviceBuffer<float> gdw(dw0), gdb(db0);
    linear_forward(gemm, gx.get(), gw.get(), gb.get(), gy.get(), M, N, K, nullptr);
    linear_backward(gemm, gdy.get(), gx.get(), gw.get(), gdx.get(), gdw.get(), gdb.get(), M, N, K, nullptr);
    const double ey = rel_l2(gy.download(), y), edx = rel_l2(gdx.download(), dx);
    const double edw = rel_l2(gdw.download(), dw), edb = rel_l2(gdb.download(), db);
    std::printf("fp16 gemm %lldx%lldx%lld: y %.2e dx %.2e dw %.2e db %.2e\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), ey, edx, edw, edb);
    EXPECT_LT(ey, 2e-3);  // one fp16 rounding of the output
    EXPECT_LT(edx, 2e-3);
    EXPECT_LT(edw, 1e-4);  // fp16 products are exact in fp32; fp32 output
    EXPECT_LT(edb, 1e-5);
  }
}

// ---- norms (fused residual add, backward with the residual branch's gradient)
TEST_F(GpuFp16, RmsNormWithResidualMatchesCpu) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{65, 2048}, {33, 100}, {40, 8192}}) {
    const auto x = rounded(random_vec<float>(rows * dim, 1, -2, 2));
    const auto res = rounded(random_vec<float>(rows * dim, 2, -2, 2));
    const auto w = rounded(random_vec<float>(dim, 3, 0.5, 1.5));
    const auto dy = rounded(random_vec<float>(rows * dim, 4, -1, 1));
    const auto dadd = rounded(random_vec<float>(rows * dim, 5, -1, 1));
    const auto dw0 = random_vec<float>(dim, 6, -1, 1);
    const auto sum = rounded(plus(x, res));
    std::vector<float> y(rows * dim), rstd(rows), dx(rows * dim), dw = dw0;
    cpu::rmsnorm_forward(sum.data(), w.data(), y.data(), rstd.data(), rows, dim, 1e-5f);
    cpu::rmsnorm_backward(dy.data(), sum.data(), w.data(), rstd.data(), dx.data(), dw.data(), rows, dim);
    const auto dx_full = plus(dx, dadd);
    Half gx(x), gres(res), gsum(rows * dim), gw(w), gy(rows * dim), gdy(dy), gdx(rows * dim), gdadd(dadd);
    DeviceBuffer<float> grstd(rows), gdw(dw0);
    add_rmsnorm_forward(gx.get(), gres.get(), gsum.get(), gw.get(), gy.get(), grstd.get(), rows, dim, 1e-5f, nullptr);
    rmsnorm_backward(gdy.get(), gsum.get(), gw.get(), grstd.get(), gdx.get(), gdw.get(), rows, dim, nullptr,
                     gdadd.get());
    const double es = rel_l2(gsum.download(), sum), ey = rel_l2(gy.download(), y), er = rel_l2(grstd.download(), rstd);
    const double edx = rel_l2(gdx.download(), dx_full), edw = rel_l2(gdw.download(), dw);
    std::printf("rmsnorm fp16 %lldx%lld: sum %.2e y %.2e rstd %.2e dx %.2e dw %.2e\n", static_cast<long long>(rows),
                static_cast<long long>(dim), es, ey, er, edx, edw);
    EXPECT_LT(es, 1e-7);  // the sum is rounded to fp16 once, as the reference
    EXPECT_LT(ey, 2e-3);
    EXPECT_LT(er, 1e-5);
    EXPECT_LT(edx, 2e-3);
    EXPECT_LT(edw, 1e-4);
  }
}

TEST_F(GpuFp16, LayerNormWithResidualMatchesCpu) {
  const int64_t rows = 65, dim = 1024;
  const auto x = rounded(random_vec<float>(rows * dim, 11, 1, 3));
  const auto res = rounded(random_vec<float>(rows * dim, 12, -2, 2));
  const auto w = rounded(random_vec<float>(dim, 13, 0.5, 1.5)), b = rounded(random_vec<float>(dim, 14, -1, 1));
  const auto dy = rounded(random_vec<float>(rows * dim, 15, -1, 1));
  const auto dw0 = random_vec<float>(dim, 16, -1, 1), db0 = random_vec<float>(dim, 17, -1, 1);
  const auto sum = rounded(plus(x, res));
  std::vector<float> y(rows * dim), mean(rows), rstd(rows), dx(rows * dim), dw = dw0, db = db0;
  cpu::layernorm_forward(sum.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), rows, dim, 1e-5f);
  cpu::layernorm_backward(dy.data(), sum.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(),
                          rows, dim);
  Half gx(x), gres(res), gsum(rows * dim), gw(w), gb(b), gy(rows * dim), gdy(dy), gdx(rows * dim);
  DeviceBuffer<float> gmean(rows), grstd(rows), gdw(dw0), gdb(db0);
  add_layernorm_forward(gx.get(), gres.get(), gsum.get(), gw.get(), gb.get(), gy.get(), gmean.get(), grstd.get(), rows,
                        dim, 1e-5f, nullptr);
  layernorm_backward(gdy.get(), gsum.get(), gw.get(), gmean.get(), grstd.get(), gdx.get(), gdw.get(), gdb.get(), rows,
                     dim, nullptr);
  EXPECT_LT(rel_l2(gsum.download(), sum), 1e-7);
  EXPECT_LT(rel_l2(gy.download(), y), 2e-3);
  EXPECT_LT(rel_l2(gmean.download(), mean), 1e-5);
  EXPECT_LT(rel_l2(grstd.download(), rstd), 1e-5);
  EXPECT_LT(rel_l2(gdx.download(), dx), 2e-3);
  EXPECT_LT(rel_l2(gdw.download(), dw), 1e-4);
  EXPECT_LT(rel_l2(gdb.download(), db), 1e-5);
}

// ---- activations
TEST_F(GpuFp16, SwigluGeluMatchCpu) {
  for (int64_t F : {int64_t{512}, int64_t{77}}) {  // vector and scalar paths
    const int64_t rows = 33;
    const auto x = rounded(random_vec<float>(rows * 2 * F, 1, -4, 4)), dy = rounded(random_vec<float>(rows * F, 2));
    std::vector<float> y(rows * F), dx(rows * 2 * F);
    cpu::swiglu_forward(x.data(), y.data(), rows, F);
    cpu::swiglu_backward(dy.data(), x.data(), dx.data(), rows, F);
    Half gx(x), gy(rows * F), gdy(dy), gdx(rows * 2 * F);
    swiglu_forward(gx.get(), gy.get(), rows, F, nullptr);
    swiglu_backward(gdy.get(), gx.get(), gdx.get(), rows, F, nullptr);
    EXPECT_LT(rel_l2(gy.download(), y), 2e-3) << F;
    EXPECT_LT(rel_l2(gdx.download(), dx), 2e-3) << F;
  }
  for (bool tanh_approx : {false, true}) {
    const int64_t n = 4099;
    const auto x = rounded(random_vec<float>(n, 3, -4, 4)), dy = rounded(random_vec<float>(n, 4));
    std::vector<float> y(n), dx(n);
    cpu::gelu_forward(x.data(), y.data(), n, tanh_approx);
    cpu::gelu_backward(dy.data(), x.data(), dx.data(), n, tanh_approx);
    Half gx(x), gy(n), gdy(dy), gdx(n);
    gelu_forward(gx.get(), gy.get(), n, tanh_approx, nullptr);
    gelu_backward(gdy.get(), gx.get(), gdx.get(), n, tanh_approx, nullptr);
    EXPECT_LT(rel_l2(gy.download(), y), 2e-3) << tanh_approx;
    EXPECT_LT(rel_l2(gdx.download(), dx), 2e-3) << tanh_approx;
  }
}

// ---- RoPE (vector path: half % 8 == 0; scalar path otherwise), and the QKV split that fuses it
TEST_F(GpuFp16, RopeMatchesCpu) {
  for (auto [D, rot] : {std::pair<int64_t, int64_t>{32, 16}, {64, 64}, {20, 12}}) {
    const int64_t B = 2, H = 3, S = 50;
    std::vector<float> cs(S * rot / 2), sn(S * rot / 2);
    cpu::rope_tables(S, rot, 10000.0, cs.data(), sn.data());
    const auto x = rounded(random_vec<float>(B * H * S * D, 5));
    auto y = x;
    cpu::rope_forward(y.data(), cs.data(), sn.data(), B, H, S, D, rot);
    DeviceBuffer<float> gcs(cs), gsn(sn);
    Half hx(x);
    rope_forward(hx.get(), gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
    EXPECT_LT(rel_l2(hx.download(), y), 2e-3) << D;
    auto back = rounded(y);
    cpu::rope_backward(back.data(), cs.data(), sn.data(), B, H, S, D, rot);
    Half hy(y);
    rope_backward(hy.get(), gcs.get(), gsn.get(), B, H, S, D, rot, nullptr);
    EXPECT_LT(rel_l2(hy.download(), back), 2e-3) << D;
  }
}

TEST_F(GpuFp16, QkvSplitWithRopeMatchesSeparateOps) {
  // The fused split (+RoPE on q and k) equals a plain split followed by the RoPE kernel, and the
  // merge inverts it; fp16 rounding happens once in each path.
  const int64_t S = 12, B = 2, G = 2, qpg = 2, D = 64, rot = 64;
  const int64_t rows = S * B, width = G * (qpg + 2) * D;
  const auto packed = rounded(random_vec<float>(rows * width, 9));
  std::vector<float> cs(S * rot / 2), sn(S * rot / 2);
  cpu::rope_tables(S, rot, 10000.0, cs.data(), sn.data());
  DeviceBuffer<float> gcs(cs), gsn(sn);
  Half gp(packed), q(B * G * qpg * S * D), k(B * G * S * D), v(B * G * S * D);
  Half q0(B * G * qpg * S * D), k0(B * G * S * D), v0(B * G * S * D);
  qkv_split(gp.get(), q.get(), k.get(), v.get(), S, B, G, qpg, D, RopeArgs{gcs.get(), gsn.get(), rot}, nullptr);
  qkv_split(gp.get(), q0.get(), k0.get(), v0.get(), S, B, G, qpg, D, RopeArgs{}, nullptr);
  rope_forward(q0.get(), gcs.get(), gsn.get(), B, G * qpg, S, D, rot, nullptr);
  rope_forward(k0.get(), gcs.get(), gsn.get(), B, G, S, D, rot, nullptr);
  EXPECT_EQ(q.raw(), q0.raw());
  EXPECT_EQ(k.raw(), k0.raw());
  EXPECT_EQ(v.raw(), v0.raw());
  Half merged(rows * width);
  qkv_merge(q.get(), k.get(), v.get(), merged.get(), S, B, G, qpg, D, RopeArgs{gcs.get(), gsn.get(), rot}, nullptr);
  EXPECT_LT(rel_l2(merged.download(), packed), 2e-3);  // rotated there and back, rounded twice
}

// ---- cross-entropy
TEST_F(GpuFp16, CrossEntropyMatchesCpu) {
  for (auto [N, V, valid] : {std::tuple<int64_t, int64_t, int64_t>{64, 1000, 990}, {16, 32000, 31999}}) {
    const auto logits = rounded(random_vec<float>(N * V, 1, -8, 8));
    std::vector<int32_t> tg(N);
    for (int64_t i = 0; i < N; ++i) tg[i] = static_cast<int32_t>((i * 104729) % valid);
    const auto dloss = random_vec<float>(N, 2, 0.5, 1.5);
    std::vector<float> loss(N), lse(N), dlog(N * V);
    cpu::cross_entropy_forward(logits.data(), tg.data(), loss.data(), lse.data(), N, V, valid);
    cpu::cross_entropy_backward(logits.data(), tg.data(), lse.data(), dloss.data(), dlog.data(), N, V, valid);
    Half gl(logits);
    DeviceBuffer<int32_t> gt(tg);
    DeviceBuffer<float> gloss(N), glse(N), gdl(dloss);
    cross_entropy_forward(gl.get(), gt.get(), gloss.get(), glse.get(), N, V, valid, nullptr);
    EXPECT_LT(rel_l2(gloss.download(), loss), 1e-5);
    EXPECT_LT(rel_l2(glse.download(), lse), 1e-5);
    cross_entropy_backward(gl.get(), gt.get(), glse.get(), gdl.get(), gl.get(), N, V, valid, nullptr);  // in place
    EXPECT_LT(rel_l2(gl.download(), dlog), 2e-3);
  }
}

// ---- embedding: the gather is a copy (bit-exact), the backward sums fp16 rows in fp32
TEST_F(GpuFp16, EmbeddingMatchesCpu) {
  const int64_t V = 97, dim = 72, n = 3000;
  const auto table = rounded(random_vec<float>(V * dim, 1)), dout = rounded(random_vec<float>(n * dim, 2));
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919 + i / 3) % (V - 10));
  std::vector<float> out(n * dim), dtable = random_vec<float>(V * dim, 3);
  const auto dtable0 = dtable;
  cpu::embedding_forward(ids.data(), table.data(), out.data(), n, dim);
  cpu::embedding_backward(ids.data(), dout.data(), dtable.data(), n, dim);
  DeviceBuffer<int32_t> gids(ids);
  Half gtable(table), gout(n * dim), gdout(dout);
  embedding_forward(gids.get(), gtable.get(), gout.get(), n, dim, nullptr);
  EXPECT_TRUE(test::bit_equal(gout.download(), out));
  DeviceBuffer<float> gdt(dtable0);
  embedding_backward(gids.get(), gdout.get(), gdt.get(), n, dim, nullptr);
  EXPECT_LT(rel_l2(gdt.download(), dtable), 1e-6);
}

// ---- casts: fp32 -> fp16 rounds to nearest even with subnormals and overflow to inf (core's
// f32_to_f16 bit for bit); fp16 -> fp32 is exact. Vector (aligned) and scalar paths.
TEST_F(GpuFp16, CastsMatchHostConversion) {
  const int64_t n = 1031;
  auto x = random_vec<float>(n, 1, -70000, 70000);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special{1.0f + 1.0f / 2048, 65504.f,  65519.f, 65520.f, -1e6f, 6e-8f, 3e-8f, 1e-5f,
                                   -0.f,               inf,      -inf,    0.1f,    2049.f, 2051.f};
  std::copy(special.begin(), special.end(), x.begin());
  std::vector<uint16_t> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = f32_to_f16(x[i]);
  for (int off : {0, 1}) {  // aligned, then one element past a 16-byte boundary
    std::vector<float> xs(off, 0.f);
    xs.insert(xs.end(), x.begin(), x.end());
    DeviceBuffer<float> gx(xs), back(n + off);
    Half h(n + off);
    cast(gx.get() + off, h.get() + off, n, nullptr);
    auto bits = h.raw();
    EXPECT_TRUE(std::equal(want.begin(), want.end(), bits.begin() + off)) << off;
    cast(h.get() + off, back.get() + off, n, nullptr);
    auto b = back.download();
    for (int64_t i = 0; i < n; ++i) {
      const float w = f16_to_f32(want[i]);
      ASSERT_TRUE(b[i + off] == w || (std::isnan(w) && std::isnan(b[i + off]))) << i;
    }
  }
  // fp16 += fp16 and fp32 += fp16 (the main-grad accumulate) in fp32 math.
  const auto a = rounded(random_vec<float>(n, 2)), c = rounded(random_vec<float>(n, 3));
  Half ha(a), hc(c);
  add_inplace(ha.get(), hc.get(), n, nullptr);
  DeviceBuffer<float> acc(a);
  add_inplace(acc.get(), hc.get(), n, nullptr);
  const auto got = ha.download(), got32 = acc.download();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], round_h(a[i] + c[i])) << i;
    ASSERT_EQ(got32[i], a[i] + c[i]) << i;
  }
}

// ---- AdamW writes the fp16 compute copy: the rounded fp32 update, bit for bit.
TEST_F(GpuFp16, AdamWWritesFp16ComputeCopy) {
  const int64_t n = 10000;
  const auto p = random_vec<float>(n, 1), g = random_vec<float>(n, 2, -0.01, 0.01);
  DeviceBuffer<float> gp(p), gg(g), m(n), v(n), pb(p), gb(g), mb(n), vb(n);
  m.fill_bytes(0), v.fill_bytes(0), mb.fill_bytes(0), vb.fill_bytes(0);
  Half out(n);
  DeviceBuffer<bf16> outb(n);
  AdamWTensor t{gp.get(), gg.get(), m.get(), v.get(), nullptr, n, true};
  t.param_f16 = out.get();
  AdamWTensor tb{pb.get(), gb.get(), mb.get(), vb.get(), outb.get(), n, true};
  AdamWHyper h;
  adamw_step({t}, h, nullptr);
  adamw_step({tb}, h, nullptr);
  const auto upd = gp.download();
  const auto bits = out.raw();
  EXPECT_TRUE(test::bit_equal(upd, pb.download()));  // the fp32 update does not depend on the copy's type
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits[i], f32_to_f16(upd[i])) << i;
  EXPECT_THROW(adamw_step({t, tb}, h, nullptr), Error);  // one compute-copy type per call
}

// ---- the loss scaler's unscale-and-check over several spans of several blocks each
TEST_F(GpuFp16, UnscaleAndCheckFindsInfAndNan) {
  const std::vector<int64_t> sizes{50000, 17, 40000};
  const float inv = 1.f / 1024.f;
  auto run = [&](int64_t poison_span, int64_t poison_at, float poison, float scale) {
    std::vector<std::vector<float>> host;
    std::vector<DeviceBuffer<float>> dev;
    std::vector<GradSpan> spans;
    for (size_t s = 0; s < sizes.size(); ++s) {
      host.push_back(random_vec<float>(sizes[s], 10 + s, -1000, 1000));
      if (static_cast<int64_t>(s) == poison_span) host.back()[poison_at] = poison;
      dev.emplace_back(host.back());
      spans.push_back({dev.back().get(), sizes[s]});
    }
    DeviceBuffer<int32_t> flag(std::vector<int32_t>{0});
    unscale_and_check(spans, scale, flag.get(), nullptr);
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::vector<float> want(host[s].size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = host[s][i] * scale;  // the CPU's fp32 product
      // Bit for bit, except that a NaN may come back with another payload (the GPU writes the
      // canonical NaN, x86 keeps the operand's).
      const auto got = dev[s].download();
      int64_t off = 0;
      for (size_t i = 0; i < want.size(); ++i)
        off += !(std::isnan(got[i]) && std::isnan(want[i])) && std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
      EXPECT_EQ(off, 0) << "span " << s;
    }
    return flag.download()[0];
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(run(-1, 0, 0.f, inv), 0);             // all finite
  EXPECT_EQ(run(0, 49999, inf, inv), 1);          // +inf in the last block of the first span
  EXPECT_EQ(run(2, 20000, nan, inv), 1);          // nan in a middle block of the last span
  EXPECT_EQ(run(1, 3, -inf, inv), 1);             // -inf in a one-block span
  EXPECT_EQ(run(0, 100, 3e38f, 1024.f), 1);       // overflow by unscaling (a loss scale below 1)
  EXPECT_EQ(run(-1, 0, 0.f, 1.f), 0);
  // Through the op the trainer calls (ranges of one flat buffer, one host read).
  test::gpu();
  std::vector<float> flat = random_vec<float>(90000, 3);
  auto up = [](const std::vector<float>& h) { return Tensor::from_vector(h, {90000}).to_device(Device::CUDA); };
  Tensor gflat = up(flat);
  EXPECT_FALSE(mt::ops::unscale_and_check(gflat, {{0, 40000}, {40000, 90000}}, inv));
  flat[89999] = nan;
  Tensor gbad = up(flat);
  EXPECT_FALSE(mt::ops::unscale_and_check(gbad, {{0, 40000}}, inv));  // outside the ranges
  EXPECT_TRUE(mt::ops::unscale_and_check(gbad, {{0, 40000}, {40000, 90000}}, inv));
}

// ---- attention through the Tensor-level wrapper: fp16 tensors run the generic fp32 kernels on
// widened copies, with fp16 results.
TEST_F(GpuFp16, AttentionWrapperMatchesCpu) {
  test::gpu();
  for (const bool causal : {true, false}) {
    ops::AttentionShape p{2, 4, 2, 40, 64, 1.f / 8.f};
    p.causal = causal;
    const int64_t nq = p.B * p.Hq * p.S * p.D, nk = p.B * p.Hkv * p.S * p.D;
    const auto q = rounded(random_vec<float>(nq, 1, -2, 2)), k = rounded(random_vec<float>(nk, 2, -2, 2));
    const auto v = rounded(random_vec<float>(nk, 3, -1, 1)), dout = rounded(random_vec<float>(nq, 4, -1, 1));
    std::vector<float> out(nq), lse(p.B * p.Hq * p.S), dq(nq), dk(nk), dv(nk);
    cpu::attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
    cpu::attention_backward(p, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data());
    auto up = [](const std::vector<float>& h, const Shape& s) {
      return Tensor::from_vector(h, s).to(DType::F16).to_device(Device::CUDA);
    };
    auto down = [](const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32).to_vector(); };
    const Tensor tq = up(q, {p.B, p.Hq, p.S, p.D}), tk = up(k, {p.B, p.Hkv, p.S, p.D}),
                 tv = up(v, {p.B, p.Hkv, p.S, p.D}), tdo = up(dout, {p.B, p.Hq, p.S, p.D});
    Tensor tout, tlse, tdq, tdk, tdv;
    mt::ops::attention_forward(p, tq, tk, tv, tout, tlse);
    ASSERT_EQ(tout.dtype(), DType::F16);
    mt::ops::attention_backward(p, tq, tk, tv, tout, tlse, tdo, tdq, tdk, tdv);
    ASSERT_EQ(tdq.dtype(), DType::F16);
    ASSERT_EQ(tdk.dtype(), DType::F16);
    const double eo = rel_l2(down(tout), out), el = rel_l2(down(tlse), lse), eq = rel_l2(down(tdq), dq),
                 ek = rel_l2(down(tdk), dk), ev = rel_l2(down(tdv), dv);
    std::printf("fp16 attention causal=%d: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", causal, eo, el, eq, ek, ev);
    EXPECT_LT(eo, 2e-3);
    EXPECT_LT(el, 1e-5);
    // The backward reads the fp16-rounded out (delta = rowsum(dout * out)): a little more error.
    EXPECT_LT(eq, 5e-3);
    EXPECT_LT(ek, 5e-3);
    EXPECT_LT(ev, 2e-3);
  }
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
