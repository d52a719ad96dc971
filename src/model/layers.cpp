#include "model/layers.h"

#include "kernels/ops.h"
#include "model/fp8_inference.h"

namespace mt::model {

namespace {
// Every GEMM of a Linear runs inside this: the one place their time is charged.
template <class F>
auto timed_gemm(PassContext& ctx, F&& gemm) -> decltype(gemm()) {
  ScopedOpTimer t(ctx.times, &OpTimes::gemm);
  return gemm();
}
}  // namespace

void Linear::build(ParamStore& ps, const std::string& prefix, int64_t in_f, int64_t out_f, bool with_bias,
                   Init init, ParallelMode m, const TensorParallel* t, int blocks) {
  in = in_f;
  out = out_f;
  mode = t && t->on() ? m : ParallelMode::None;
  tp = t;
  TPSplit wsplit = mode == ParallelMode::Column ? t->split(0, blocks) : mode == ParallelMode::Row ? t->split(1) : TPSplit{};
  weight = &ps.add(prefix + ".weight", {out, in}, init, true, wsplit);
  weight->gemm_only_grad = true;  // Linear::backward's weight GEMM is its only gradient
  TPSplit bsplit = mode == ParallelMode::Column ? t->split(0, blocks) : TPSplit{};
  bias = with_bias ? &ps.add(prefix + ".bias", {out}, Init::Zeros, false, bsplit) : nullptr;
}

const Tensor* Linear::forward_bias() const {
  if (!bias || (mode == ParallelMode::Row && tp->rank() != 0)) return nullptr;
  return &bias->value;
}

Tensor Linear::forward(const Tensor& x, PassContext& ctx, const Tensor* residual, const Tensor* x_amax) const {
  MT_CHECK(!residual || fuses_residual(), "Linear::forward: a residual is added only inside a bias-free GEMM without TP");
  ctx.before_use(weight);
  ctx.before_use(bias);
  if (overlaps_comm()) return forward_column_overlapped(x, ctx);
  Tensor xf = input_region().forward(x, ctx.times);
  // FP8 weights quantised at load (generate/serve --fp8-format): that path whatever the row count
  // (it pads decode's few rows itself), so neither the bf16 GEMM nor a small-M GEMV runs here.
  if (fp8_frozen(fp8))
    return output_region().forward(fp8_inference_forward(fp8, xf, forward_bias(), residual, ctx), ctx.times);
  if (fp8_gemms(x)) {
    const Tensor y = fp8.gemm_forward(xf, weight->value, residual, keeps_input(x, ctx), ctx, x_amax);
    return output_region().forward(y, ctx.times);
  }
  Tensor w = weight->value;
  if (fp8.on()) {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    xf = fp8.forward_input(xf, ctx);
    w = fp8.forward_weight(w, ctx);
  }
  Tensor y = timed_gemm(ctx, [&] {
    return residual ? ops::linear_forward_residual(xf, w, nullptr, *residual) : ops::linear_forward(xf, w, forward_bias());
  });
  return output_region().forward(y, ctx.times);
}

Tensor Linear::backward(const Tensor& dy, const Tensor& x, PassContext& ctx, const Tensor* dy_amax) const {
  Tensor dx;
  if (overlaps_comm()) {
    dx = backward_column_overlapped(dy, x, ctx);
  } else {
    // A column-parallel input is re-gathered rather than kept gathered (as Megatron). A
    // row-parallel output gradient, gathered from sequence shards, gives every rank the complete
    // gradient of the replicated bias, which so stays identical without a TP reduction.
    // x is undefined where forward kept its FP8 codes instead (keeps_input).
    const Tensor xf = x.defined() ? input_region().forward(x, ctx.times) : Tensor();
    const Tensor dyf = output_region().backward(dy, ctx.times);
    if (fp8.backward_is_real()) {
      const bool defer = defers_wgrad();
      dx = fp8.gemm_backward(dyf, xf, weight->value, weight->grad, weight->take_accumulate(), ctx, dy_amax, nullptr,
                             defer);
      return finish_backward(input_region().backward(dx, ctx.times), ctx, defer);
    }
    MT_CHECK(xf.defined(), "Linear::backward of {} without its input", weight->name);
    if (fp8.on()) return backward_fp8(dyf, xf, ctx);
    dx = timed_gemm(ctx, [&] {
      return ops::linear_backward(dyf, xf, weight->value, weight->grad, bias ? &bias->grad : nullptr, true,
                                  weight->take_accumulate());
    });
    dx = input_region().backward(dx, ctx.times);
  }
  return finish_backward(dx, ctx);
}

Tensor Linear::finish_backward(const Tensor& dx, PassContext& ctx, bool wgrad_deferred) const {
  if (wgrad_deferred) ctx.deferred_grads.push_back(weight);
  else if (report_weight_grad) ctx.grad_ready(weight);
  ctx.grad_ready(bias);
  return dx;
}

bool Linear::wants_input_amax(int64_t rows, Device d, const PassContext& ctx) const {
  const bool gathered = mode == ParallelMode::Column && tp && tp->sp();
  return bias == nullptr && !gathered && fp8.takes_producer_amax(rows, d, weight->value, ctx, false);
}

bool Linear::wants_grad_amax(const PassContext& ctx) const {
  const bool gathered = mode == ParallelMode::Row && tp && tp->sp();
  return bias == nullptr && !gathered && !overlaps_comm() &&
         fp8.takes_producer_amax(0, Device::CPU, weight->value, ctx, true);
}

bool Linear::wants_input_codes(int64_t rows, Device d, const PassContext& ctx) const {
  // keeps_input's conditions: the codes replace the input for the weight gradient too.
  const bool gathered = mode == ParallelMode::Column && tp && tp->sp();
  return bias == nullptr && !gathered && !ctx.recompute_group && !input_kept_by_caller &&
         fp8.producer_casts(rows, d, weight->value, ctx, false);
}

bool Linear::wants_grad_codes(const PassContext& ctx) const {
  const bool gathered = mode == ParallelMode::Row && tp && tp->sp();
  return bias == nullptr && !gathered && !overlaps_comm() && fp8.producer_casts(0, Device::CPU, weight->value, ctx, true);
}

// The input's way in (input_region) is the identity here: wants_input_codes excludes the
// gathered one. As forward's GPU FP8 path otherwise.
Tensor Linear::forward_codes(const Fp8Linear::ProducerCast& pc, PassContext& ctx, const Tensor* residual) const {
  MT_CHECK(!residual || fuses_residual(), "Linear::forward: a residual is added only inside a bias-free GEMM without TP");
  ctx.before_use(weight);
  const Tensor y = fp8.gemm_forward(Tensor(), weight->value, residual, true, ctx, nullptr, &pc);
  return output_region().forward(y, ctx.times);
}

// The output gradient's way in (output_region's backward) is the identity here (wants_grad_codes).
Tensor Linear::backward_codes(const Fp8Linear::ProducerCast& pc, const Tensor& x, PassContext& ctx) const {
  const Tensor xf = x.defined() ? input_region().forward(x, ctx.times) : Tensor();
  const bool defer = defers_wgrad();
  const Tensor dx = fp8.gemm_backward(Tensor(), xf, weight->value, weight->grad, weight->take_accumulate(), ctx,
                                      nullptr, &pc, defer);
  return finish_backward(input_region().backward(dx, ctx.times), ctx, defer);
}

bool Linear::keeps_input(const Tensor& x, const PassContext& ctx) const {
  // Not in the first forward of a recomputed group (the group re-runs it; then it keeps), not
  // where backward gathers the input again anyway (sequence-parallel column input), not when
  // the weight gradient's GEMM reads x in the activation type (--no-fp8-wgrad).
  const bool gathered = mode == ParallelMode::Column && tp && tp->sp();
  return fp8_gemms(x) && ctx.training && (ctx.recomputing || !ctx.recompute_group) && !gathered &&
         !input_kept_by_caller && fp8.store->config().wgrad;
}

// The FP8 backward: the data and weight gradients as two GEMMs, since their operands differ in
// general (blockwise tiles run along each GEMM's reduction dimension; --no-fp8-wgrad).
Tensor Linear::backward_fp8(const Tensor& dyf, const Tensor& xf, PassContext& ctx) const {
  Fp8Linear::Backward b;
  Tensor w;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::fp8_cast);
    b = fp8.backward_operands(dyf, xf);
    w = fp8.forward_weight(weight->value, ctx);
  }
  Tensor dx = timed_gemm(ctx, [&] { return ops::linear_backward_data(b.dy_dgrad, w); });
  timed_gemm(ctx, [&] {
    ops::linear_backward_weight(b.dy_wgrad, b.x_wgrad, weight->grad, bias ? &bias->grad : nullptr,
                                weight->take_accumulate());
  });
  return finish_backward(input_region().backward(dx, ctx.times), ctx);
}

// The rank's own rows of the output need only its own input rows: their GEMM runs while the
// other ranks' rows arrive, then the rows before and after them.
Tensor Linear::forward_column_overlapped(const Tensor& x, PassContext& ctx) const {
  const int64_t n = tp->size(), r = tp->rank(), rows = x.numel() / in;
  const Tensor x2 = x.view({rows, in});
  TPRegion::InFlight gather = input_region().start_forward(x2, ctx.times);
  Tensor y = Tensor::empty({n * rows, weight->value.dim(0)}, x.dtype(), x.device());
  auto rows_gemm = [&](const Tensor& in_rows, int64_t first, int64_t count) {
    if (count == 0) return;
    Tensor out_rows = y.slice(first, count);
    timed_gemm(ctx, [&] { ops::linear_forward_into(in_rows, weight->value, forward_bias(), out_rows); });
  };
  rows_gemm(x2, r * rows, rows);
  const Tensor xf = gather.wait(ctx.times);
  rows_gemm(xf.slice(0, r * rows), 0, r * rows);
  rows_gemm(xf.slice((r + 1) * rows, (n - r - 1) * rows), (r + 1) * rows, (n - r - 1) * rows);
  return y;
}

// The input re-gather runs during the data-gradient GEMM (which does not need the input), and
// the data gradient's reduce-scatter during the weight-gradient GEMM (which does not need it).
Tensor Linear::backward_column_overlapped(const Tensor& dy, const Tensor& x, PassContext& ctx) const {
  TPRegion::InFlight gather = input_region().start_forward(x.view({x.numel() / in, in}), ctx.times);
  const Tensor dxf = timed_gemm(ctx, [&] { return ops::linear_backward_data(dy, weight->value); });
  const Tensor xf = gather.wait(ctx.times);
  TPRegion::InFlight scatter = input_region().start_backward(dxf, ctx.times);
  timed_gemm(ctx, [&] {
    ops::linear_backward_weight(dy, xf, weight->grad, bias ? &bias->grad : nullptr, weight->take_accumulate());
  });
  return scatter.wait(ctx.times);
}

void Norm::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& cfg, const TensorParallel* tp) {
  rms = cfg.rmsnorm();
  eps = cfg.norm_epsilon;
  one_plus = cfg.layernorm_zero_centered_gamma;
  half = cfg.half();
  weight = &ps.add(prefix + ".weight", {cfg.hidden_size}, one_plus ? Init::Zeros : Init::Ones, false);
  bias = rms ? nullptr : &ps.add(prefix + ".bias", {cfg.hidden_size}, Init::Zeros, false);
  const bool sp = tp && tp->sp();
  weight->sequence_parallel = sp;
  if (bias) bias->sequence_parallel = sp;
}

Tensor Norm::forward(const Tensor& x, Saved& s, PassContext& ctx, Tensor* amax) const {
  ctx.before_use(weight);
  ctx.before_use(bias);
  ScopedOpTimer t(ctx.times, &OpTimes::norm);
  s.x = x;
  s.scale = scale();
  if (rms) return ops::rmsnorm_forward(x, s.scale, eps, s.rstd, amax);
  Tensor y = ops::layernorm_forward(x, s.scale, bias->value, eps, s.mean, s.rstd);
  if (amax) ops::fp8_amax(y, *amax);
  return y;
}

Tensor Norm::scale() const {
  if (!one_plus) return weight->value;
  const Tensor& w = weight->main;
  if (!ones_.defined() || ones_.device() != w.device())
    ones_ = Tensor::from_vector(std::vector<float>(static_cast<size_t>(w.numel()), 1.0f), w.shape()).to_device(w.device());
  Tensor g = ones_.clone();
  ops::add_inplace(g, w);
  const DType t = weight->value.dtype();
  if (t == DType::F32) {  // fp32, or the CPU's emulation of half storage
    round_to_half_inplace(g, half);
    return g;
  }
  Tensor out = Tensor::empty(g.shape(), t, g.device());
  ops::cast(g, out);
  return out;
}

Tensor Norm::forward_residual(const Tensor& x, const Tensor& residual, Tensor& sum, Half half, Saved& s,
                              PassContext& ctx, Tensor* amax) const {
  if (emulates_half(x, half)) {
    // CPU emulation of half storage: the sum is rounded to the half type before the norm sees
    // it, as the GPU kernel stores and normalises it.
    {
      ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
      sum = x.clone();
      ops::add_inplace(sum, residual);
      round_to_half_inplace(sum, half);
    }
    return forward(sum, s, ctx, amax);
  }
  ctx.before_use(weight);
  ctx.before_use(bias);
  ScopedOpTimer t(ctx.times, &OpTimes::norm);
  s.scale = scale();
  Tensor y = rms ? ops::add_rmsnorm_forward(x, residual, s.scale, eps, s.rstd, sum, amax)
                 : ops::add_layernorm_forward(x, residual, s.scale, bias->value, eps, s.mean, s.rstd, sum);
  if (amax && !rms) ops::fp8_amax(y, *amax);
  s.x = sum;
  return y;
}

Tensor Norm::backward(const Tensor& dy, Saved& s, PassContext& ctx, const Tensor* dx_add) const {
  ScopedOpTimer t(ctx.times, &OpTimes::norm);
  Tensor dx = rms ? ops::rmsnorm_backward(dy, s.x, s.scale, s.rstd, weight->grad, dx_add)
                  : ops::layernorm_backward(dy, s.x, s.scale, s.mean, s.rstd, weight->grad, bias->grad, dx_add);
  s = Saved{};
  ctx.grad_ready(weight);
  ctx.grad_ready(bias);
  return dx;
}

Tensor Dropout::forward(const Tensor& x, Saved& s, PassContext& ctx) const {
  s.active = ctx.training && p > 0.f;
  if (!s.active) return x;
  ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
  RngState* rng = ctx.region_rng(tp_region);
  s.seed = rng->seed;
  s.offset = rng->next_offset(1);
  return ops::dropout_forward(x, p, s.seed, s.offset);
}

Tensor Dropout::backward(const Tensor& dy, const Saved& s, OpTimes* times) const {
  if (!s.active) return dy;
  ScopedOpTimer t(times, &OpTimes::elementwise);
  return ops::dropout_backward(dy, p, s.seed, s.offset);
}

bool emulates_half(const Tensor& t, Half h) { return t.device() != Device::CUDA && h != Half::None; }

void round_to_half_inplace(Tensor& t, Half h) {
  if (t.device() == Device::CUDA) return;  // GPU tensors are stored in the half type already
  if (h == Half::BF16) ops::round_bf16_inplace(t);
  else if (h == Half::FP16) ops::round_f16_inplace(t);
}

}  // namespace mt::model
