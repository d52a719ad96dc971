#include "model/fp8.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/fp8_codes.h"
#include "kernels/ops.h"

namespace mt::model {

namespace {

void init_state(Fp8TensorState& s, int64_t history_len) {
  s.history = Tensor::zeros({history_len});
  s.scale = Tensor::from_vector(std::vector<float>{1.f}, {1});
  s.amax = Tensor::zeros({1});
  s.saturated = Tensor::zeros({1}, DType::I64);
}

void move_state(Fp8TensorState& s, Device d) {
  for (Tensor* t : {&s.history, &s.scale, &s.amax, &s.saturated}) *t = t->to_device(d);
}

// DeepSeek-V3's tiles: activations 1x128 along the GEMM's reduction dimension, weights 128x128.
constexpr int64_t kTile = 128;

}  // namespace

Fp8LinearState& Fp8Store::add(const std::string& name) {
  Fp8LinearState& l = linears_.emplace_back();
  l.name = name;
  for (Fp8TensorState* s : {&l.input, &l.weight, &l.grad}) init_state(*s, cfg_.amax_history_len);
  return l;
}

void Fp8Store::to_device(Device d) {
  for (Fp8LinearState& l : linears_) {
    for (Fp8TensorState* s : {&l.input, &l.weight, &l.grad}) move_state(*s, d);
    l.weight_q = Tensor();
    l.weight_epoch = -1;
    l.pending_input_scales.clear();
    l.weight_codes = l.weight_scale = l.weight_scale_inv = l.recast_amax = l.recast_saturated = Tensor();
    l.saved.clear();
  }
}

namespace {


// A per-tensor (delayed or tensorwise) quantization of x as `fmt`. `update`: a training use,
// whose amax joins the delayed history. Returns x read back; `used` (if given) receives a copy
// of the scale it was quantized with.
Tensor per_tensor(const Tensor& x, Fp8TensorState& s, Fp8Format fmt, const Fp8Config& c, const TensorParallel* tp,
                  bool update, const Fp8Store& store, const Fp8LinearState& l, Tensor* used = nullptr) {
  ops::fp8_amax(x, s.amax);
  store.reduce_amax(s.amax, tp, l);
  if (c.recipe == Fp8Recipe::Tensorwise) ops::fp8_current_scale(s.amax, s.scale, fp8_max(fmt));
  Tensor y = ops::fp8_fake_quantize(x, s.scale, fmt, s.saturated);
  if (used) {
    *used = Tensor::empty({1}, DType::F32, s.scale.device());
    ops::copy_into(*used, s.scale);
  }
  if (c.recipe == Fp8Recipe::Delayed && update)
    ops::fp8_delayed_update(s.history, s.scale, s.amax, fp8_max(fmt), static_cast<int>(c.margin), c.amax_max);
  return y;
}

// A blockwise quantization of a 2-D operand; scales written into a scratch tensor (they are a
// function of x alone: no state to keep).
Tensor blocks(const Tensor& x, Fp8Format fmt, int64_t tile_r, int64_t tile_c) {
  const Tensor x2 = x.view({x.numel() / x.dim(-1), x.dim(-1)});
  const int64_t n = ((x2.dim(0) + tile_r - 1) / tile_r) * ((x2.dim(1) + tile_c - 1) / tile_c);
  Tensor scales = Tensor::empty({n}, DType::F32, x.device());
  return ops::fp8_fake_quantize_blocks(x2, fmt, tile_r, tile_c, scales).view(x.shape());
}

}  // namespace

void Fp8Store::reduce_amax(Tensor& amax, const TensorParallel* tp, const Fp8LinearState& l) const {
  // The operand's amax over every TP rank's shard (the max of the ranks' maxima), so that all
  // ranks quantize with one scale and a TP layout quantizes as the single rank does.
  if (tp && tp->on()) tp->comm->all_reduce(amax.raw(), 1, comm::DataType::F32, comm::ReduceOp::Max);
  if (cfg_.recipe == Fp8Recipe::Delayed && l.group_amax && amax_group_ && amax_group_->size() > 1)
    amax_group_->all_reduce(amax.raw(), 1, comm::DataType::F32, comm::ReduceOp::Max);
}

Fp8Health take_fp8_health(Fp8Store& store) {
  Fp8Health h;
  const bool per_tensor = store.config().recipe != Fp8Recipe::Blockwise;
  for (Fp8LinearState& l : store.linears())
    for (Fp8TensorState* s : {&l.input, &l.weight, &l.grad}) {
      h.saturated += *s->saturated.to_device(Device::CPU).data<int64_t>();
      s->saturated = Tensor::zeros({1}, DType::I64, s->saturated.device());
      if (!per_tensor) continue;
      const float v = s->scale.to_device(Device::CPU).to_vector()[0];
      h.min_scale = h.has_scales ? std::min(h.min_scale, v) : v;
      h.max_scale = h.has_scales ? std::max(h.max_scale, v) : v;
      h.has_scales = true;
    }
  return h;
}

Fp8Linear make_fp8_linear(Fp8Store& store, const std::string& weight_name, const TensorParallel* tp) {
  const std::string suffix = ".weight";
  MT_CHECK(weight_name.size() > suffix.size() && weight_name.ends_with(suffix), "FP8 linear of parameter '{}'",
           weight_name);
  return Fp8Linear{&store.add(weight_name.substr(0, weight_name.size() - suffix.size())), &store, tp};
}

Tensor Fp8Linear::forward_input(const Tensor& x, const PassContext& ctx) const {
  const Fp8Config& c = store->config();
  const Fp8Format fmt = c.forward_format();
  if (c.recipe == Fp8Recipe::Blockwise) return blocks(x, fmt, 1, kTile);
  if (ctx.recomputing) {
    // The re-run of a forward whose backward comes next: its input scale is the oldest pending.
    MT_CHECK(!state->pending_input_scales.empty(), "{}: an FP8 recomputation without its first forward", state->name);
    Tensor scratch = Tensor::zeros({1}, DType::I64, x.device());
    return ops::fp8_fake_quantize(x, state->pending_input_scales.front(), fmt, scratch);
  }
  if (!ctx.training) return per_tensor(x, state->input, fmt, c, tp, false, *store, *state);
  Tensor used;
  Tensor y = per_tensor(x, state->input, fmt, c, tp, true, *store, *state, &used);
  state->pending_input_scales.push_back(std::move(used));
  return y;
}

Tensor Fp8Linear::gathered_weight(const Tensor& w) const {
  MT_CHECK(state->weight_codes.defined(), "{}: --fp8-param-gather's weight codes were not gathered before this pass",
           state->name);
  if (!state->weight_q.defined())
    state->weight_q = ops::fp8_dequantize(state->weight_codes, state->weight_scale_inv,
                                          store->config().forward_format(), w.dtype());
  return state->weight_q;
}

Tensor Fp8Linear::forward_weight(const Tensor& w, const PassContext& ctx) const {
  if (state->param_gathered) return gathered_weight(w);
  const Fp8Config& c = store->config();
  const Fp8Format fmt = c.forward_format();
  const bool cached = state->weight_epoch == store->epoch() && state->weight_q.defined();
  if (ctx.training && cached) return state->weight_q;
  const Tensor q = c.recipe == Fp8Recipe::Blockwise
                       ? blocks(w, fmt, kTile, kTile)
                       : per_tensor(w, state->weight, fmt, c, tp, ctx.training, *store, *state);
  // Evaluation quantizes with the state as it is and leaves both it and the cache alone, so that
  // evaluating changes nothing in training.
  if (ctx.training) {
    state->weight_q = q;
    state->weight_epoch = store->epoch();
  }
  return q;
}

Fp8Linear::Backward Fp8Linear::backward_operands(const Tensor& dy, const Tensor& x) const {
  const Fp8Config& c = store->config();
  const Fp8Format gf = c.grad_format(), ff = c.forward_format();
  Backward b;
  if (c.recipe == Fp8Recipe::Blockwise) {
    b.dy_dgrad = blocks(dy, gf, 1, kTile);
    // The weight gradient reduces over rows: its operands' tiles run down the columns.
    b.dy_wgrad = c.wgrad ? blocks(dy, gf, kTile, 1) : dy;
    b.x_wgrad = c.wgrad ? blocks(x, ff, kTile, 1) : x;
    return b;
  }
  MT_CHECK(!state->pending_input_scales.empty(), "{}: an FP8 backward without its forward", state->name);
  const Tensor scale = std::move(state->pending_input_scales.front());
  state->pending_input_scales.pop_front();
  b.dy_dgrad = per_tensor(dy, state->grad, gf, c, tp, true, *store, *state);
  if (!c.wgrad) {
    b.dy_wgrad = dy;
    b.x_wgrad = x;
    return b;
  }
  b.dy_wgrad = b.dy_dgrad;
  Tensor scratch = Tensor::zeros({1}, DType::I64, x.device());  // counted in the forward already
  b.x_wgrad = ops::fp8_fake_quantize(x, scale, ff, scratch);
  return b;
}

}  // namespace mt::model
