// The FP8 linear's real-GEMM path (model/fp8_gemms.cpp) against the emulation (model/fp8.cpp):
// the same scaling state after every step (the same ops on the same amaxes), and the GEMMs'
// results within fp32 rounding on the CPU (its fp8_gemm sums the exact code products, the
// emulation the read-back values), within bf16's on the GPU. The path runs for CPU tensors through
// Fp8Store::real_gemms_on_cpu; the *Gpu* cases run it where it is meant to run.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/ops.h"
#include "model/fp8.h"
#include "support/gpu.h"

namespace mt::model {
namespace {

constexpr int64_t kRows = 32, kIn = 48, kOut = 16;
// A linear's GEMM dimensions (blockwise scaling's real GEMMs take multiples of 128; 384 = three K
// tiles, which cuBLASLt's 128x128 scale layout pads to four).
struct Dims {
  int64_t rows = kRows, in = kIn, out = kOut;
};
constexpr Dims kBlockDims{256, 384, 128};

Fp8Config config(Fp8Recipe r, bool wgrad = true, bool hybrid = true) {
  Fp8Config c;
  c.enabled = true;
  c.hybrid = hybrid;
  c.recipe = r;
  c.amax_history_len = 3;
  c.amax_max = true;
  c.margin = r == Fp8Recipe::Delayed ? 1 : 0;
  c.wgrad = wgrad;
  return c;
}

// Two stores of one recipe on the real-GEMM path, each with a linear of the same name (so the same
// initial state), on device d: an A/B pair whose outputs and states must agree bit for bit.
struct TwinLinears {
  Fp8Store a, b;
  Fp8Linear la, lb;
  explicit TwinLinears(Fp8Recipe r, Device d = Device::CPU) : a(config(r)), b(config(r)), la(make(a)), lb(make(b)) {
    if (d == Device::CPU) return;
    a.to_device(d);
    b.to_device(d);
  }

 private:
  static Fp8Linear make(Fp8Store& s) {
    s.real_gemms_on_cpu = true;
    return make_fp8_linear(s, "l.weight", nullptr);
  }
};

// Values in [-mag, mag] that bf16 holds exactly (so that a GPU copy is the same numbers).
Tensor data(Shape s, uint64_t seed, double mag) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(-mag, mag);
  std::vector<float> v(static_cast<size_t>(shape_numel(s)));
  for (float& x : v) x = round_bf16(static_cast<float>(dist(gen)));
  return Tensor::from_vector(v, s);
}

Tensor on(const Tensor& t, Device d) { return d == Device::CPU ? t : t.to(DType::BF16).to_device(d); }

std::vector<float> host(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  return h.dtype() == DType::F32 ? h.to_vector() : h.to(DType::F32).to_vector();
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);  // exact zeros: the absolute error
}

struct StepOut {
  std::vector<float> y1, y2, dx1, dx2, dw;
};

// Two micro-batches (two forwards, then their backwards, oldest first) of one step through the
// emulation: the operands quantized and read back, then the activation-type GEMMs.
StepOut emulated(Fp8Linear& l, const Tensor& x1, const Tensor& x2, const Tensor& w, const Tensor& dy1,
                 const Tensor& dy2, Dims dims) {
  PassContext ctx;
  StepOut o;
  auto fwd = [&](const Tensor& x) {
    const Tensor xq = l.forward_input(x, ctx), wq = l.forward_weight(w, ctx);
    return ops::linear_forward(xq, wq, nullptr);
  };
  o.y1 = host(fwd(x1));
  o.y2 = host(fwd(x2));
  Tensor dw = Tensor::zeros({dims.out, dims.in});
  auto bwd = [&](const Tensor& dy, const Tensor& x, bool acc) {
    const Fp8Linear::Backward b = l.backward_operands(dy, x);
    const Tensor dx = ops::linear_backward_data(b.dy_dgrad, l.forward_weight(w, ctx));
    ops::linear_backward_weight(b.dy_wgrad, b.x_wgrad, dw, nullptr, acc);
    return host(dx);
  };
  o.dx1 = bwd(dy1, x1, false);
  o.dx2 = bwd(dy2, x2, true);
  o.dw = dw.to_vector();
  return o;
}

// The same step through the real FP8 GEMMs on `d`. The first forward keeps its input's transposed
// codes (its backward gets no x) where FP8 wgrad is on; the second's backward re-casts x.
StepOut real(Fp8Linear& l, const Tensor& x1, const Tensor& x2, const Tensor& w, const Tensor& dy1, const Tensor& dy2,
             Device d, Dims dims) {
  PassContext ctx;
  StepOut o;
  const Tensor wd = on(w, d), x1d = on(x1, d), x2d = on(x2, d);
  EXPECT_TRUE(l.real_gemms(x1d, wd));
  const bool keep = l.store->config().wgrad;  // as Linear::keeps_input: not without FP8 wgrad
  o.y1 = host(l.gemm_forward(x1d, wd, nullptr, keep, ctx));
  o.y2 = host(l.gemm_forward(x2d, wd, nullptr, false, ctx));
  Tensor dw = Tensor::zeros({dims.out, dims.in}, DType::F32, d);
  EXPECT_TRUE(l.backward_is_real());
  o.dx1 = host(l.gemm_backward(on(dy1, d), keep ? Tensor() : x1d, wd, dw, false, ctx));
  o.dx2 = host(l.gemm_backward(on(dy2, d), x2d, wd, dw, true, ctx));
  EXPECT_FALSE(l.backward_is_real());
  o.dw = host(dw);
  return o;
}

void expect_same_state(Fp8Store& a, Fp8Store& b) {
  Fp8LinearState &x = a.linears().front(), &y = b.linears().front();
  for (auto [s, t] : {std::pair{&x.input, &y.input}, std::pair{&x.weight, &y.weight}, std::pair{&x.grad, &y.grad}}) {
    EXPECT_EQ(host(s->scale), host(t->scale));
    EXPECT_EQ(host(s->history), host(t->history));
  }
  const Fp8Health ha = take_fp8_health(a), hb = take_fp8_health(b);
  EXPECT_EQ(ha.saturated, hb.saturated);
}

// Three steps; the first input's magnitude saturates the delayed recipe's initial scale of 1.
void compare(Fp8Recipe r, Device d, double tol, bool wgrad = true, Dims dims = {}, bool hybrid = true) {
  Fp8Store emu(config(r, wgrad, hybrid)), gem(config(r, wgrad, hybrid));
  gem.real_gemms_on_cpu = true;
  Fp8Linear le = make_fp8_linear(emu, "l.weight", nullptr), lg = make_fp8_linear(gem, "l.weight", nullptr);
  if (d != Device::CPU) gem.to_device(d);
  const double mags[] = {2000.0, 3.0, 0.05};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    const uint64_t s = 100 * static_cast<uint64_t>(step);
    const Tensor w = data({dims.out, dims.in}, s + 1, 0.5), x1 = data({dims.rows, dims.in}, s + 2, mags[step]),
                 x2 = data({dims.rows, dims.in}, s + 3, 1.0), dy1 = data({dims.rows, dims.out}, s + 4, 1e-3),
                 dy2 = data({dims.rows, dims.out}, s + 5, 2e-3);
    const StepOut want = emulated(le, x1, x2, w, dy1, dy2, dims);
    const StepOut got = real(lg, x1, x2, w, dy1, dy2, d, dims);
    EXPECT_LT(rel(got.y1, want.y1), tol);
    EXPECT_LT(rel(got.y2, want.y2), tol);
    EXPECT_LT(rel(got.dx1, want.dx1), tol);
    EXPECT_LT(rel(got.dx2, want.dx2), tol);
    EXPECT_LT(rel(got.dw, want.dw), tol);
    expect_same_state(emu, gem);
    emu.weights_changed();
    gem.weights_changed();
  }
}

TEST(Fp8Gemms, DelayedMatchesTheEmulation) { compare(Fp8Recipe::Delayed, Device::CPU, 1e-5); }
TEST(Fp8Gemms, TensorwiseMatchesTheEmulation) { compare(Fp8Recipe::Tensorwise, Device::CPU, 1e-5); }
TEST(Fp8Gemms, WithoutFp8WgradMatchesTheEmulation) { compare(Fp8Recipe::Delayed, Device::CPU, 1e-5, false); }
// Blockwise: the codes read back are the emulated operands exactly; the GEMMs differ in summation
// order only (the real path's CPU stand-in sums the dequantized codes in fp32).
TEST(Fp8Gemms, BlockwiseMatchesTheEmulation) { compare(Fp8Recipe::Blockwise, Device::CPU, 1e-5, true, kBlockDims); }
TEST(Fp8Gemms, BlockwiseWithoutFp8WgradMatchesTheEmulation) {
  compare(Fp8Recipe::Blockwise, Device::CPU, 1e-5, false, kBlockDims);
}

// Blockwise has no scale to remember: a recomputed forward casts again, the transposed input kept
// by its re-run or cast again in the backward gives the same weight gradient.
TEST(Fp8Gemms, BlockwiseRecomputedForwardKeepsTheCodes) {
  const Dims d = kBlockDims;
  const Tensor w = data({d.out, d.in}, 1, 0.5), x = data({d.rows, d.in}, 2, 2000), dy = data({d.rows, d.out}, 3, 1e-3);
  TwinLinears t(Fp8Recipe::Blockwise);
  Fp8Store& a = t.a;
  Fp8Linear &la = t.la, &lb = t.lb;
  PassContext ctx, re;
  re.recomputing = true;
  const std::vector<float> y = la.gemm_forward(x, w, nullptr, false, ctx).to_vector();
  ASSERT_EQ(a.linears().front().saved.size(), 1u);
  EXPECT_FALSE(a.linears().front().saved.front().x_t.defined());
  EXPECT_EQ(la.gemm_forward(x, w, nullptr, true, re).to_vector(), y);
  ASSERT_EQ(a.linears().front().saved.size(), 1u);
  EXPECT_TRUE(a.linears().front().saved.front().x_t.defined());
  EXPECT_EQ(lb.gemm_forward(x, w, nullptr, false, ctx).to_vector(), y);
  Tensor dw_kept = Tensor::zeros({d.out, d.in}), dw_recast = Tensor::zeros({d.out, d.in});
  const std::vector<float> dxa = la.gemm_backward(dy, Tensor(), w, dw_kept, false, ctx).to_vector();
  EXPECT_EQ(lb.gemm_backward(dy, x, w, dw_recast, false, ctx).to_vector(), dxa);
  EXPECT_EQ(dw_recast.to_vector(), dw_kept.to_vector());
  EXPECT_FALSE(la.backward_is_real());
}

TEST(Fp8Gemms, RecomputedForwardKeepsTheFirstScaleAndTheCodes) {
  const Tensor w = data({kOut, kIn}, 1, 0.5), x = data({kRows, kIn}, 2, 2000), dy = data({kRows, kOut}, 3, 1e-3);
  // A: a first forward that keeps nothing (inside a recomputed group), its re-run keeps the
  // codes, the backward gets no x. B: one forward, the backward re-casts x.
  TwinLinears t(Fp8Recipe::Delayed);
  Fp8Store& a = t.a;
  Fp8Linear &la = t.la, &lb = t.lb;
  PassContext ctx, re;
  re.recomputing = true;
  const std::vector<float> y = la.gemm_forward(x, w, nullptr, false, ctx).to_vector();  // saturates at scale 1
  EXPECT_EQ(la.gemm_forward(x, w, nullptr, true, re).to_vector(), y);                   // that scale again
  ASSERT_EQ(a.linears().front().saved.size(), 1u);
  EXPECT_TRUE(a.linears().front().saved.front().x_t.defined());
  EXPECT_EQ(lb.gemm_forward(x, w, nullptr, false, ctx).to_vector(), y);
  Tensor dw_kept = Tensor::zeros({kOut, kIn}), dw_recast = Tensor::zeros({kOut, kIn});
  const std::vector<float> dxa = la.gemm_backward(dy, Tensor(), w, dw_kept, false, ctx).to_vector();
  EXPECT_EQ(lb.gemm_backward(dy, x, w, dw_recast, false, ctx).to_vector(), dxa);
  EXPECT_EQ(dw_recast.to_vector(), dw_kept.to_vector());
  EXPECT_GT(take_fp8_health(a).saturated, 0);  // counted by the first forward only
}

TEST(Fp8Gemms, EligibilityNeedsMultiplesOf16Or128ForBlocks) {
  Fp8Store store(config(Fp8Recipe::Tensorwise)), blocks(config(Fp8Recipe::Blockwise));
  Fp8Linear l = make_fp8_linear(store, "l.weight", nullptr), b = make_fp8_linear(blocks, "b.weight", nullptr);
  const Tensor w = Tensor::zeros({kOut, kIn}), x = Tensor::zeros({kRows, kIn});
  EXPECT_FALSE(l.real_gemms(x, w));  // CPU tensors: the emulation
  store.real_gemms_on_cpu = blocks.real_gemms_on_cpu = true;
  EXPECT_TRUE(l.real_gemms(x, w));
  EXPECT_FALSE(l.real_gemms(Tensor::zeros({kRows - 1, kIn}), w));
  EXPECT_FALSE(l.real_gemms(Tensor::zeros({kRows, 40}), Tensor::zeros({kOut, 40})));
  EXPECT_FALSE(b.real_gemms(x, w));  // blockwise: 128-wide tiles (and a warning, once per shape)
  const Dims d = kBlockDims;
  EXPECT_TRUE(b.real_gemms(Tensor::zeros({d.rows, d.in}), Tensor::zeros({d.out, d.in})));
  EXPECT_FALSE(b.real_gemms(Tensor::zeros({d.rows + 16, d.in}), Tensor::zeros({d.out, d.in})));
}

// The producer fusion (model/fp8.h, fp8_producer_amax): the casts handed their operand's amax
// (as SwiGLU or RMSNorm compute it, here fp8_amax) give the bits of the casts that find it
// themselves, and the same scaling state, over steps whose magnitudes move the scales. Only
// current scaling takes it; the eligibility follows the real-GEMM path's.
void expect_producer_amax_changes_nothing(Device d) {
  TwinLinears t(Fp8Recipe::Tensorwise, d);
  Fp8Store &plain = t.a, &fused = t.b;
  Fp8Linear &lp = t.la, &lf = t.lb;
  set_fp8_producer_amax(true);  // whatever MT_FP8_UNFUSED says
  PassContext ctx, re;
  re.recomputing = true;
  const int64_t uses = fp8_producer_fusions();
  const double mags[] = {2000.0, 3.0, 0.05};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    const uint64_t s = 100 * static_cast<uint64_t>(step);
    const Tensor w = on(data({kOut, kIn}, s + 1, 0.5), d), x = on(data({kRows, kIn}, s + 2, mags[step]), d),
                 dy = on(data({kRows, kOut}, s + 4, 1e-3 * mags[step]), d);
    EXPECT_TRUE(lf.takes_producer_amax(kRows, d, w, ctx, false));
    EXPECT_FALSE(lf.takes_producer_amax(kRows, d, w, re, false));  // a re-run reuses its first scale
    EXPECT_FALSE(lf.takes_producer_amax(kRows - 1, d, w, ctx, false));
    EXPECT_FALSE(lf.takes_producer_amax(kRows, d, w, ctx, true));  // no forward waits for its backward
    auto amax_of = [&](const Tensor& t) {
      Tensor a = Tensor::zeros({1}, DType::F32, d);
      ops::fp8_amax(t, a);
      return a;
    };
    const Tensor xa = amax_of(x), dya = amax_of(dy);
    EXPECT_EQ(host(lf.gemm_forward(x, w, nullptr, true, ctx, &xa)), host(lp.gemm_forward(x, w, nullptr, true, ctx)));
    EXPECT_TRUE(lf.takes_producer_amax(kRows, d, w, ctx, true));
    Tensor dw_f = Tensor::zeros({kOut, kIn}, DType::F32, d), dw_p = Tensor::zeros({kOut, kIn}, DType::F32, d);
    EXPECT_EQ(host(lf.gemm_backward(dy, Tensor(), w, dw_f, false, ctx, &dya)),
              host(lp.gemm_backward(dy, Tensor(), w, dw_p, false, ctx)));
    EXPECT_EQ(host(dw_f), host(dw_p));
    expect_same_state(plain, fused);
    EXPECT_EQ(host(fused.linears().front().input.amax), host(plain.linears().front().input.amax));
    EXPECT_EQ(host(fused.linears().front().grad.amax), host(plain.linears().front().grad.amax));
    plain.weights_changed();
    fused.weights_changed();
  }
  EXPECT_EQ(fp8_producer_fusions(), uses + 6);  // both operands, three steps
  Fp8Store delayed(config(Fp8Recipe::Delayed));
  delayed.real_gemms_on_cpu = true;
  const Fp8Linear ld = make_fp8_linear(delayed, "d.weight", nullptr);
  EXPECT_FALSE(ld.takes_producer_amax(kRows, Device::CPU, Tensor::zeros({kOut, kIn}), ctx, false));
  set_fp8_producer_amax(false);  // MT_FP8_UNFUSED's switch
  EXPECT_FALSE(lf.takes_producer_amax(kRows, d, on(Tensor::zeros({kOut, kIn}), d), ctx, false));
  set_fp8_producer_amax(true);
}
// Delayed scaling's producer fusion: the producer writes the operand's codes with the state's
// scale (here fp8_cast_transpose stands in for SwiGLU's fused kernels, ops-tested on their own);
// the GEMMs and the scaling state are those of the casts the linear makes itself, bit for bit.
void expect_producer_codes_change_nothing(Device d) {
  TwinLinears t(Fp8Recipe::Delayed, d);
  Fp8Store &plain = t.a, &fused = t.b;
  Fp8Linear &lp = t.la, &lf = t.lb;
  set_fp8_producer_amax(true);
  PassContext ctx, eval;
  eval.training = false;
  const int64_t uses = fp8_producer_fusions();
  const double mags[] = {2000.0, 3.0, 0.05};  // the first saturates the initial scale of 1
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    const uint64_t s = 100 * static_cast<uint64_t>(step);
    const Tensor w = on(data({kOut, kIn}, s + 1, 0.5), d), x = on(data({kRows, kIn}, s + 2, mags[step]), d),
                 dy = on(data({kRows, kOut}, s + 4, 1e-3 * mags[step]), d);
    EXPECT_TRUE(lf.producer_casts(kRows, d, w, ctx, false));
    EXPECT_FALSE(lf.producer_casts(kRows, d, w, eval, false));
    EXPECT_FALSE(lf.producer_casts(kRows, d, w, ctx, true));  // no forward waits for its backward
    const DType dt = x.dtype();
    Fp8Linear::ProducerCast px = lf.producer_cast(kRows, kIn, dt, false);
    ops::fp8_cast_transpose(x, px.scale, px.format, px.q, &px.qt, px.amax, px.saturated);
    EXPECT_EQ(host(lf.gemm_forward(Tensor(), w, nullptr, true, ctx, nullptr, &px)),
              host(lp.gemm_forward(x, w, nullptr, true, ctx)));
    EXPECT_TRUE(lf.producer_casts(kRows, d, w, ctx, true));
    Fp8Linear::ProducerCast pg = lf.producer_cast(kRows, kOut, dt, true);
    ops::fp8_cast_transpose(dy, pg.scale, pg.format, pg.q, &pg.qt, pg.amax, pg.saturated);
    Tensor dw_f = Tensor::zeros({kOut, kIn}, DType::F32, d), dw_p = Tensor::zeros({kOut, kIn}, DType::F32, d);
    EXPECT_EQ(host(lf.gemm_backward(Tensor(), Tensor(), w, dw_f, false, ctx, nullptr, &pg)),
              host(lp.gemm_backward(dy, Tensor(), w, dw_p, false, ctx)));
    EXPECT_EQ(host(dw_f), host(dw_p));
    expect_same_state(plain, fused);
    plain.weights_changed();
    fused.weights_changed();
  }
  EXPECT_EQ(fp8_producer_fusions(), uses + 6);
  Fp8Store nowgrad(config(Fp8Recipe::Delayed, false));
  nowgrad.real_gemms_on_cpu = true;
  const Fp8Linear ln = make_fp8_linear(nowgrad, "n.weight", nullptr);
  EXPECT_FALSE(ln.producer_casts(kRows, Device::CPU, Tensor::zeros({kOut, kIn}), ctx, false));  // wgrad reads x
}

// The opt-in switches (model/fp8.h, Fp8Switches) change no bit under current scaling: the fused
// scale, the transposed weight from the cached codes, and the output gradient's codes from its
// producer (fp8_amax and fp8_cast_transpose stand in for SwiGLU backward's two passes, ops-tested
// on their own), and (the GPU) the weight gradient left running on a side stream until joined.
// Two micro-batches a step, so that the second reads the cached weight codes.
void expect_switches_change_nothing(Device d) {
  TwinLinears t(Fp8Recipe::Tensorwise, d);
  Fp8Store &plain = t.a, &switched = t.b;
  Fp8Linear &lp = t.la, &ls = t.lb;
  set_fp8_producer_amax(true);
  const Fp8Switches before = fp8_switches();
  const Fp8Switches off{}, on_all{true, true, true, true};
  PassContext ctx;
  const int64_t uses = fp8_producer_fusions();
  const double mags[] = {2000.0, 3.0, 0.05};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    const uint64_t s = 100 * static_cast<uint64_t>(step);
    const Tensor w = on(data({kOut, kIn}, s + 1, 0.5), d);
    for (int mb = 0; mb < 2; ++mb) {  // the second's output gradient: through its producer's codes
      const Tensor x = on(data({kRows, kIn}, s + 2 + mb, mags[step]), d),
                   dy = on(data({kRows, kOut}, s + 4 + mb, 1e-3 * mags[step]), d);
      set_fp8_switches(off);
      EXPECT_FALSE(lp.producer_casts(kRows, d, w, ctx, true));
      const std::vector<float> yp = host(lp.gemm_forward(x, w, nullptr, true, ctx));
      Tensor dw_p = Tensor::zeros({kOut, kIn}, DType::F32, d), dw_s = Tensor::zeros({kOut, kIn}, DType::F32, d);
      const std::vector<float> dxp = host(lp.gemm_backward(dy, Tensor(), w, dw_p, false, ctx));
      set_fp8_switches(on_all);
      EXPECT_FALSE(ls.producer_casts(kRows, d, w, ctx, true));  // no forward waits for its backward
      EXPECT_EQ(host(ls.gemm_forward(x, w, nullptr, true, ctx)), yp);
      ASSERT_TRUE(ls.producer_casts(kRows, d, w, ctx, true));
      std::vector<float> dxs;
      // The weight gradient left running where the switch lets it (the GPU), joined before dw is read.
      const bool defer = ls.defers_wgrad(d);
      EXPECT_EQ(defer, d == Device::CUDA);
      if (mb == 0) {
        dxs = host(ls.gemm_backward(dy, Tensor(), w, dw_s, false, ctx, nullptr, nullptr, defer));
      } else {
        Fp8Linear::ProducerCast pc = ls.producer_cast(kRows, kOut, dy.dtype(), true);
        ASSERT_TRUE(pc.current);
        ops::fp8_amax(dy, pc.amax);
        ls.producer_current_scale(pc, true);
        ops::fp8_cast_transpose(dy, pc.scale, pc.format, pc.q, &pc.qt, pc.amax, pc.saturated);
        dxs = host(ls.gemm_backward(Tensor(), Tensor(), w, dw_s, false, ctx, nullptr, &pc, defer));
      }
      ops::join_deferred_work(d);
      EXPECT_EQ(dxs, dxp);
      EXPECT_EQ(host(dw_s), host(dw_p));
    }
    expect_same_state(plain, switched);
    EXPECT_EQ(host(switched.linears().front().grad.amax), host(plain.linears().front().grad.amax));
    plain.weights_changed();
    switched.weights_changed();
  }
  EXPECT_EQ(fp8_producer_fusions(), uses + 3);  // the second micro-batches' output gradients
  set_fp8_switches(before);
}

TEST(Fp8Gemms, OptInSwitchesChangeNoBit) { expect_switches_change_nothing(Device::CPU); }
TEST(Fp8GemmsGpu, OptInSwitchesChangeNoBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_switches_change_nothing(Device::CUDA);
}

TEST(Fp8Gemms, ProducerAmaxChangesNoBit) { expect_producer_amax_changes_nothing(Device::CPU); }
TEST(Fp8Gemms, ProducerCodesChangeNoBit) { expect_producer_codes_change_nothing(Device::CPU); }
TEST(Fp8GemmsGpu, ProducerCodesChangeNoBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_producer_codes_change_nothing(Device::CUDA);
}
TEST(Fp8GemmsGpu, ProducerAmaxChangesNoBit) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  expect_producer_amax_changes_nothing(Device::CUDA);
}

// GPU against the CPU's emulation: the scaling state exactly (the same bf16 inputs, the same
// amaxes and fp32 scale rules), the outputs within bf16's rounding.
TEST(Fp8GemmsGpu, DelayedMatchesTheCpuEmulation) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  compare(Fp8Recipe::Delayed, Device::CUDA, 1e-2);
}
TEST(Fp8GemmsGpu, TensorwiseMatchesTheCpuEmulation) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  compare(Fp8Recipe::Tensorwise, Device::CUDA, 1e-2);
}
// cuBLASLt's block-scaled GEMMs (E4M3 throughout, Transformer Engine's blockwise default).
TEST(Fp8GemmsGpu, BlockwiseMatchesTheCpuEmulation) {
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  compare(Fp8Recipe::Blockwise, Device::CUDA, 1e-2, true, kBlockDims, false);
}

}  // namespace
}  // namespace mt::model
