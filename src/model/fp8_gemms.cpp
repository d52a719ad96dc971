// The GPU path of an FP8 linear (model/fp8.h): each GEMM operand is cast to FP8 codes once, by the
// fused cast(+transpose)+amax kernel, and the forward, data-gradient and weight-gradient GEMMs run
// on the codes through cuBLASLt (kernels/cuda/fp8_gemm.cpp). Hopper's FP8 GEMMs read both operands
// K-major, so:
//   forward  y  [rows, out] = x [rows, in]    . w [out, in]^T     (both as stored)
//   dgrad    dx [rows, in]  = dy [rows, out]  . w^T [in, out]^T   (the weight transposed)
//   wgrad    dw [out, in]   = dy^T [out, rows] . x^T [in, rows]^T (both transposed)
// The scales follow the emulation's rules exactly (same ops on the same state): delayed casts with
// the state's scale and updates history and scale afterwards from the amax the cast computed;
// tensorwise takes the amax first (a pass of its own, or from the tensor's producer: model/fp8.h,
// fp8_producer_amax), then its scale, then casts. Everything stays on the device: scales,
// inverses and amaxes are [1] tensors read by the kernels and cuBLASLt.
// Memory: the weight's codes (1 byte a parameter) are cached for the optimizer step; its transpose
// is cast again in each backward (a pass over the weight, freed after the data gradient); the input
// is kept as transposed codes (1 byte an element) where the caller can drop its own copy.
#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/fp8_codes.h"
#include "kernels/fp8_deferred.h"
#include "kernels/ops.h"
#include "model/fp8.h"

namespace mt::model {

namespace {

Tensor scalar(Device d) { return Tensor::empty({1}, DType::F32, d); }
Tensor codes(int64_t r, int64_t c, Device d) { return Tensor::empty({r, c}, DType::U8, d); }
Tensor rows2d(const Tensor& x) { return x.view({x.numel() / x.dim(-1), x.dim(-1)}); }

std::atomic<int64_t> producer_fusions{0};

// What follows a cast's kernel: delayed scaling reduces the amax the cast found over TP (and the
// amax group) and, for a training use, moves history and scale on; `used` / `used_inv` receive
// the scale the cast used and its inverse.
void finish_cast(Fp8TensorState& s, Fp8Format fmt, const Fp8Store& store, const Fp8LinearState& l,
                 const TensorParallel* tp, bool update, Tensor& used, Tensor& used_inv) {
  const Fp8Config& c = store.config();
  const bool current = c.recipe == Fp8Recipe::Tensorwise;
  if (!current) store.reduce_amax(s.amax, tp, l);
  used = scalar(s.scale.device());
  used_inv = scalar(s.scale.device());
  ops::fp8_snapshot_scale(s.scale, used, used_inv);
  if (!current && update)
    ops::fp8_delayed_update(s.history, s.scale, s.amax, fp8_max(fmt), static_cast<int>(c.margin), c.amax_max);
}

// x cast with the recipe's per-tensor scale into q (row-major, skipped if undefined) and qt
// (transposed, if given); `used` / `used_inv` receive the scale the cast used and its inverse.
// `update`: a training use, whose amax joins the delayed history (the emulation's per_tensor).
// given_amax: max |x| already computed by x's producer (current scaling only): it becomes the
// state's amax (the producer's [1] tensor, not copied), and the cast skips its own amax pass.
void cast(const Tensor& x, Fp8TensorState& s, Fp8Format fmt, const Fp8Store& store, const Fp8LinearState& l,
          const TensorParallel* tp, bool update, Tensor& q, Tensor* qt, Tensor& used, Tensor& used_inv,
          const Tensor* given_amax = nullptr) {
  const Fp8Config& c = store.config();
  const bool current = c.recipe == Fp8Recipe::Tensorwise;
  if (current) {
    if (given_amax) {
      MT_CHECK(given_amax->numel() == 1 && given_amax->device() == x.device(), "{}: a producer amax of shape {}",
               l.name, given_amax->shape_str());
      s.amax = *given_amax;
      producer_fusions.fetch_add(1, std::memory_order_relaxed);
    } else {
      ops::fp8_amax(x, s.amax);
    }
    store.reduce_amax(s.amax, tp, l);
    if (fp8_switches().fused_scale) {
      // MT_FP8_FUSED_SCALE: the scale, its copy and inverse from the cast's own kernel (the amax
      // is final: the kernel reduces none; nothing else follows under current scaling).
      used = scalar(s.scale.device());
      used_inv = scalar(s.scale.device());
      ops::fp8_cast_transpose_current(x, s.amax, fmt, s.scale, used, used_inv, q, qt, s.saturated);
      return;
    }
    ops::fp8_current_scale(s.amax, s.scale, fp8_max(fmt));
  } else {
    s.amax.zero_();  // the cast max-reduces into it
  }
  ops::fp8_cast_transpose(x, s.scale, fmt, q, qt, s.amax, s.saturated);
  finish_cast(s, fmt, store, l, tp, update, used, used_inv);
}

// x cast again with a scale already used (a recomputed forward, the backward's transposes): the
// same codes as the first cast; amax and clipped count were recorded then and are dropped here.
// Where casts put the amax (and clipped count) nobody reads: made once per linear and device.
Tensor& scratch_amax(Fp8LinearState& l, Device d) {
  if (!l.recast_amax.defined() || l.recast_amax.device() != d) {
    l.recast_amax = Tensor::zeros({1}, DType::F32, d);
    l.recast_saturated = Tensor::zeros({1}, DType::I64, d);
  }
  return l.recast_amax;
}

void recast(Fp8LinearState& l, const Tensor& x, const Tensor& scale, Fp8Format fmt, Tensor& q, Tensor* qt) {
  ops::fp8_cast_transpose(x, scale, fmt, q, qt, scratch_amax(l, x.device()), l.recast_saturated);
}

bool mult16(int64_t v) { return v > 0 && v % 16 == 0; }

bool env_on(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::string(e) != "0";
}

// MT_FP8_UNFUSED=1: every cast finds its amax itself (the A/B switch of the producer fusion).
std::atomic<bool> producer_amax_on{!env_on("MT_FP8_UNFUSED")};

// "0" turns a default-on switch off; anything but "0" turns an opt-in one on.
bool env_off(const char* name) {
  const char* e = std::getenv(name);
  return e && std::string(e) == "0";
}

// The switches (model/fp8.h, Fp8Switches), read once at start-up.
std::atomic<bool> fused_scale_on{!env_off("MT_FP8_FUSED_SCALE")}, wt_from_codes_on{!env_off("MT_FP8_WT_FROM_CODES")},
    swiglu_grad_codes_on{env_on("MT_FP8_SWIGLU_GRAD_CODES")}, wgrad_overlap_on{env_on("MT_FP8_WGRAD_OVERLAP")};

}  // namespace

Fp8Switches fp8_switches() {
  return Fp8Switches{fused_scale_on.load(std::memory_order_relaxed), wt_from_codes_on.load(std::memory_order_relaxed),
                     swiglu_grad_codes_on.load(std::memory_order_relaxed),
                     wgrad_overlap_on.load(std::memory_order_relaxed)};
}
void set_fp8_switches(const Fp8Switches& s) {
  fused_scale_on.store(s.fused_scale, std::memory_order_relaxed);
  wt_from_codes_on.store(s.wt_from_codes, std::memory_order_relaxed);
  swiglu_grad_codes_on.store(s.swiglu_grad_codes, std::memory_order_relaxed);
  wgrad_overlap_on.store(s.wgrad_overlap, std::memory_order_relaxed);
}

bool Fp8Linear::defers_wgrad(Device d) const {
  return on() && fp8_switches().wgrad_overlap && d == Device::CUDA && store->config().wgrad &&
         store->config().recipe != Fp8Recipe::Blockwise;
}

bool fp8_producer_amax() { return producer_amax_on.load(std::memory_order_relaxed); }
void set_fp8_producer_amax(bool on) { producer_amax_on.store(on, std::memory_order_relaxed); }
int64_t fp8_producer_fusions() { return producer_fusions.load(std::memory_order_relaxed); }

bool Fp8Linear::real_gemms(const Tensor& x, const Tensor& w) const {
  if (!on() || store->real_gemms_off || (x.device() != Device::CUDA && !store->real_gemms_on_cpu)) return false;
  if (store->config().recipe == Fp8Recipe::Blockwise) return block_real_gemms(x, w);
  return w.ndim() == 2 && mult16(w.dim(0)) && mult16(w.dim(1)) && x.dim(-1) == w.dim(1) &&
         mult16(x.numel() / x.dim(-1));
}

bool Fp8Linear::takes_producer_amax(int64_t rows, Device d, const Tensor& w, const PassContext& ctx, bool grad) const {
  if (!on() || !fp8_producer_amax() || store->config().recipe != Fp8Recipe::Tensorwise) return false;
  if (grad) return backward_is_real();  // the forward ran the real GEMMs: so does its backward
  if (ctx.recomputing || (d != Device::CUDA && !store->real_gemms_on_cpu)) return false;
  return w.ndim() == 2 && mult16(w.dim(0)) && mult16(w.dim(1)) && mult16(rows);
}

bool Fp8Linear::producer_casts(int64_t rows, Device d, const Tensor& w, const PassContext& ctx, bool grad) const {
  // Without FP8 wgrad the weight gradient reads the operands in the activation type: no codes only.
  if (!on() || !fp8_producer_amax() || !store->config().wgrad) return false;
  const Fp8Recipe r = store->config().recipe;
  if (r == Fp8Recipe::Tensorwise) return grad && fp8_switches().swiglu_grad_codes && backward_is_real();
  if (r != Fp8Recipe::Delayed) return false;
  if (grad) return backward_is_real();
  if (!ctx.training || ctx.recomputing || (d != Device::CUDA && !store->real_gemms_on_cpu)) return false;
  return w.ndim() == 2 && mult16(w.dim(0)) && mult16(w.dim(1)) && mult16(rows);
}

Fp8Linear::ProducerCast Fp8Linear::producer_cast(int64_t rows, int64_t cols, DType dtype, bool grad) const {
  const Fp8Config& c = store->config();
  Fp8TensorState& s = grad ? state->grad : state->input;
  const bool current = c.recipe == Fp8Recipe::Tensorwise;
  if (!current) s.amax.zero_();  // the producer max-reduces into it (current: its amax pass sets it)
  const Device d = s.scale.device();
  ProducerCast pc;
  pc.scale = s.scale;
  pc.amax = s.amax;
  pc.saturated = s.saturated;
  pc.format = grad ? c.grad_format() : c.forward_format();
  pc.dtype = dtype;
  pc.current = current;
  pc.q = codes(rows, cols, d);
  // The forward's input is kept as transposed codes for the weight gradient; the output
  // gradient's transpose is that GEMM's other operand.
  if (!grad || c.wgrad) pc.qt = codes(cols, rows, d);
  return pc;
}

void Fp8Linear::producer_current_scale(ProducerCast& pc, bool grad) const {
  MT_CHECK(pc.current, "{}: a current scale for a delayed-scaling producer", state->name);
  Fp8TensorState& s = grad ? state->grad : state->input;
  store->reduce_amax(s.amax, tp, *state);
  ops::fp8_current_scale(s.amax, s.scale, fp8_max(pc.format));
  pc.amax = scratch_amax(*state, s.amax.device());
}

void Fp8Linear::weight_codes(const Tensor& w, const PassContext& ctx, Tensor& q, Tensor& scale,
                             Tensor& scale_inv) const {
  // --fp8-param-gather: the distributed optimizer's gathered codes, in every pass.
  if (state->param_gathered)
    MT_CHECK(state->weight_codes.defined(), "{}: --fp8-param-gather's weight codes were not gathered before this pass",
             state->name);
  if (state->param_gathered || (ctx.training && state->weight_epoch == store->epoch() && state->weight_codes.defined())) {
    q = state->weight_codes;
    scale = state->weight_scale;
    scale_inv = state->weight_scale_inv;
    return;
  }
  const Fp8Config& c = store->config();
  q = codes(w.dim(0), w.dim(1), w.device());
  cast(w, state->weight, c.forward_format(), *store, *state, tp, ctx.training, q, nullptr, scale, scale_inv);
  // Evaluation casts with the state as it is and leaves the cache alone (as the emulation).
  if (ctx.training) {
    state->weight_codes = q;
    state->weight_scale = scale;
    state->weight_scale_inv = scale_inv;
    state->weight_epoch = store->epoch();
  }
}

Tensor Fp8Linear::gemm_forward(const Tensor& x, const Tensor& w, const Tensor* residual, bool keep_x_t,
                               PassContext& ctx, const Tensor* x_amax, const ProducerCast* pc) const {
  const Fp8Config& c = store->config();
  if (c.recipe == Fp8Recipe::Blockwise) return block_gemm_forward(x, w, residual, keep_x_t, ctx);
  const Fp8Format ff = c.forward_format();
  MT_CHECK(!pc || (ctx.training && !ctx.recomputing && keep_x_t && pc->qt.defined()),
           "{}: producer codes outside a first training forward that keeps them", state->name);
  const Tensor x2 = pc ? Tensor() : rows2d(x);
  const int64_t rows = pc ? pc->q.dim(0) : x2.dim(0), in = pc ? pc->q.dim(1) : x2.dim(1), out = w.dim(0);
  MT_CHECK(w.dim(1) == in, "{}: an FP8 GEMM of input [{}, {}] and weight {}", state->name, rows, in, w.shape_str());
  const Device dev = pc ? pc->q.device() : x.device();
  Tensor q = pc ? pc->q : codes(rows, in, dev);
  Tensor x_t = pc ? pc->qt : keep_x_t ? codes(in, rows, dev) : Tensor();
  Tensor x_scale_inv, wq, w_scale, w_scale_inv;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    if (pc) {
      // The producer cast with the state's scale: what cast() does after its kernel.
      Tensor used;
      finish_cast(state->input, ff, *store, *state, tp, true, used, x_scale_inv);
      state->saved.push_back(Fp8Saved{used, x_scale_inv, x_t, Tensor()});
      producer_fusions.fetch_add(1, std::memory_order_relaxed);
    } else if (ctx.recomputing) {
      // The re-run of a forward whose backward comes next: the first run's scale, and now (if
      // asked) the transposed codes that the first run, inside a recomputed group, did not keep.
      MT_CHECK(!state->saved.empty(), "{}: an FP8 recomputation without its first forward", state->name);
      Fp8Saved& e = state->saved.front();
      recast(*state, x2, e.scale, ff, q, keep_x_t ? &x_t : nullptr);
      if (keep_x_t) e.x_t = x_t;
      x_scale_inv = e.scale_inv;
    } else {
      Tensor used;
      cast(x2, state->input, ff, *store, *state, tp, ctx.training, q, keep_x_t ? &x_t : nullptr, used, x_scale_inv,
           x_amax);
      if (ctx.training) state->saved.push_back(Fp8Saved{used, x_scale_inv, x_t, Tensor()});
    }
    weight_codes(w, ctx, wq, w_scale, w_scale_inv);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  Tensor y = Tensor::empty({rows, out}, pc ? pc->dtype : x.dtype(), dev);
  // Fast accumulation in the forward only, as Transformer Engine's recipes (the gradients'
  // GEMMs promote their partial sums to fp32).
  ops::fp8_gemm_into(q, ff, x_scale_inv, wq, ff, w_scale_inv, residual, y, true);
  return y;
}

Tensor Fp8Linear::gemm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, bool accumulate_dw,
                                PassContext& ctx, const Tensor* dy_amax, const ProducerCast* pc,
                                bool defer_wgrad) const {
  const Fp8Config& c = store->config();
  const Fp8Format ff = c.forward_format(), gf = c.grad_format();
  MT_CHECK(!state->saved.empty(), "{}: an FP8 backward without its forward", state->name);
  const Fp8Saved e = std::move(state->saved.front());
  state->saved.pop_front();
  MT_CHECK(!pc || (c.wgrad && pc->qt.defined()), "{}: producer codes of the gradient without FP8 wgrad",
           state->name);
  const Tensor dy2 = pc ? Tensor() : rows2d(dy);
  const int64_t rows = pc ? pc->q.dim(0) : dy2.dim(0), out = pc ? pc->q.dim(1) : dy2.dim(1), in = w.dim(1);
  MT_CHECK(w.dim(0) == out, "{}: an FP8 backward of gradient [{}, {}] and weight {}", state->name, rows, out,
           w.shape_str());
  if (c.recipe == Fp8Recipe::Blockwise) return block_gemm_backward(e, dy2, x, w, dw, accumulate_dw, ctx);
  const Device dev = pc ? pc->q.device() : dy.device();
  Tensor dq = pc ? pc->q : codes(rows, out, dev);
  Tensor dq_t = pc ? pc->qt : c.wgrad ? codes(out, rows, dev) : Tensor();
  Tensor g_scale, g_scale_inv, wq, w_scale, w_scale_inv, w_t = codes(in, out, dev);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    if (pc) {
      finish_cast(state->grad, gf, *store, *state, tp, true, g_scale, g_scale_inv);
      producer_fusions.fetch_add(1, std::memory_order_relaxed);
    } else {
      cast(dy2, state->grad, gf, *store, *state, tp, true, dq, c.wgrad ? &dq_t : nullptr, g_scale, g_scale_inv,
           dy_amax);
    }
    weight_codes(w, ctx, wq, w_scale, w_scale_inv);
    Tensor none;
    // The codes transposed are the re-cast's bytes (the same scale on the same weight); reading
    // them moves 1 byte per element where the bf16 weight moves 2 (MT_FP8_WT_FROM_CODES).
    if (state->param_gathered || fp8_switches().wt_from_codes) ops::fp8_transpose_codes(wq, w_t);
    else recast(*state, w, w_scale, ff, none, &w_t);
  }
  Tensor dx = Tensor::empty({rows, in}, pc ? pc->dtype : dy.dtype(), dev);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    ops::fp8_gemm_into(dq, gf, g_scale_inv, w_t, ff, w_scale_inv, nullptr, dx);
  }
  w_t = Tensor();
  if (!c.wgrad) {
    MT_CHECK(x.defined(), "{}: --no-fp8-wgrad needs the forward's input", state->name);
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    ops::linear_backward_weight(dy, x, dw, nullptr, accumulate_dw);
    return dx;
  }
  Tensor x_t = e.x_t;
  if (!x_t.defined()) {
    MT_CHECK(x.defined(), "{}: an FP8 backward with neither the input nor its codes", state->name);
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    x_t = codes(in, rows, dev);
    Tensor none;
    recast(*state, rows2d(x), e.scale, ff, none, &x_t);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  if (defer_wgrad)
    ops::fp8_gemm_into_deferred(dq_t, gf, g_scale_inv, x_t, ff, e.scale_inv, accumulate_dw ? &dw : nullptr, dw);
  else
    ops::fp8_gemm_into(dq_t, gf, g_scale_inv, x_t, ff, e.scale_inv, accumulate_dw ? &dw : nullptr, dw);
  return dx;
}

}  // namespace mt::model
