#include "model/moe/experts.h"

#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

namespace {

// A plain (no TP communication) Linear whose weight is `wsplit`'s shard of [out, in] and whose
// bias is `bsplit`'s of [out]: an expert's fc1 or fc2 under expert TP.
Linear expert_linear(ParamStore& ps, const std::string& prefix, int64_t in, int64_t out, bool with_bias, Init init,
                     TPSplit wsplit, TPSplit bsplit) {
  Linear l;
  l.in = in;
  l.out = out;
  l.weight = &ps.add(prefix + ".weight", {out, in}, init, true, wsplit);
  l.bias = with_bias ? &ps.add(prefix + ".bias", {out}, Init::Zeros, false, bsplit) : nullptr;
  // Like a Linear's, the weight's gradient is written by its step's first GEMM rather than zeroed
  // first. An expert that receives no token in a micro-batch runs no GEMM there, yet its gradient
  // may be reduced as soon as it is reported ready: take_accumulate_dw zeroes it then.
  l.weight->gemm_only_grad = true;
  for (Param* p : {l.weight, l.bias})
    if (p) p->expert = true;
  return l;
}

}  // namespace

void join_deferred_expert_grads(PassContext& ctx) {
  if (ctx.deferred_grads.empty()) return;
  ops::join_deferred_work(ctx.deferred_grads.front()->value.device());
  for (const Param* p : ctx.deferred_grads) ctx.grad_ready(p);
  ctx.deferred_grads.clear();
}

void GroupedExperts::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t first,
                           int64_t count, const ExpertParallel* ep) {
  first_expert = first;
  num_local = count;
  const int etp = ep ? ep->etp_size() : 1, r = ep ? ep->etp_rank() : 0;
  const int64_t ffn = c.moe.moe_ffn_hidden_size;
  MT_CHECK(ffn % etp == 0, "moe_ffn_hidden_size {} over {} expert-TP ranks", ffn, etp);
  // A row-split fc2's bias would be added by every ETP rank (Megatron refuses it too).
  MT_CHECK(etp == 1 || !c.add_bias_linear, "experts with linear biases under expert tensor parallelism");
  local_ffn = ffn / etp;
  swiglu = c.swiglu;
  openai_gelu = c.openai_gelu;
  recompute_act = c.recomputes("moe_act");
  grouped_gemm = c.moe.grouped_gemm;
  const int blocks = swiglu ? 2 : 1;  // fc1 = [gate; up]: each ETP rank holds [gate_r; up_r]
  const TPSplit column = etp > 1 ? TPSplit{0, blocks, r, etp} : TPSplit{};
  const TPSplit row = etp > 1 ? TPSplit{1, 1, r, etp} : TPSplit{};
  fc1.clear();
  fc2.clear();
  for (int64_t i = 0; i < count; ++i) {
    const std::string p = prefix + ".local_experts." + std::to_string(first + i);
    fc1.push_back(expert_linear(ps, p + ".linear_fc1", c.hidden_size, blocks * ffn, c.add_bias_linear, Init::Normal,
                                column, column));
    fc2.push_back(expert_linear(ps, p + ".linear_fc2", ffn, c.hidden_size, c.add_bias_linear, Init::ScaledNormal,
                                row, TPSplit{}));
  }
}

namespace {

// Rows [off, off + n) of t.
Tensor rows(const Tensor& t, int64_t off, int64_t n) { return t.slice(off, n); }

// Grouped GEMMs (--moe-grouped-gemm) need bias-free experts outside FP8 (whose casts are per expert).
bool grouped(const std::vector<Linear>& lin, bool grouped_gemm) {
  return grouped_gemm && !lin.empty() && !lin[0].bias && !lin[0].fp8.on();
}

std::vector<const Tensor*> weights(const std::vector<Linear>& lin) {
  std::vector<const Tensor*> w;
  for (const Linear& l : lin) w.push_back(&l.weight->value);
  return w;
}

// y rows of each expert = x rows x W^T (+ b), written in place.
void expert_gemms(const std::vector<Linear>& lin, const Tensor& x, Tensor& y, const std::vector<int64_t>& counts,
                  bool grouped_gemm, PassContext& ctx) {
  ScopedOpTimer t(ctx.times, &OpTimes::expert_gemm);
  if (grouped(lin, grouped_gemm)) {
    for (const Linear& l : lin) ctx.before_use(l.weight);
    ops::grouped_linear_forward(x, weights(lin), counts, y);
    return;
  }
  int64_t off = 0;
  for (size_t i = 0; i < lin.size(); ++i) {
    ctx.before_use(lin[i].weight);
    ctx.before_use(lin[i].bias);
    if (counts[i] > 0) {
      Tensor out = rows(y, off, counts[i]);
      Tensor xi = rows(x, off, counts[i]), w = lin[i].weight->value;
      if (lin[i].fp8.on()) {
        ScopedOpTimer f(ctx.times, &OpTimes::fp8_cast);
        xi = lin[i].fp8.forward_input(xi, ctx);
        w = lin[i].fp8.forward_weight(w, ctx);
      }
      ops::linear_forward_into(xi, w, lin[i].bias ? &lin[i].bias->value : nullptr, out);
    }
    off += counts[i];
  }
}

// The grouped experts' weight-gradient GEMMs are left running beside the backward that follows
// (the next layers' attention, say), on the GPU: they read their inputs and write only their own
// gradients, which nothing reads before join_deferred_expert_grads. MT_DEFER_EXPERT_WGRAD=0 joins
// them at once (for measuring the overlap); the bits are the same either way.
// Per expert: whether its weight-gradient GEMM adds to the gradient (false: the step's first
// write). An expert without rows here whose gradient is still unwritten gets zeros now, since
// the gradient is reported ready after this pass.
std::vector<bool> take_accumulate_dw(const std::vector<Linear>& lin, const std::vector<int64_t>& counts) {
  std::vector<bool> acc(lin.size(), true);
  for (size_t i = 0; i < lin.size(); ++i) {
    if (counts[i] > 0) {
      acc[i] = lin[i].weight->take_accumulate();
    } else if (!lin[i].weight->take_accumulate()) {
      lin[i].weight->grad.zero_();
    }
  }
  return acc;
}

bool defer_weight_grads() {
  static const bool on = [] {
    const char* v = std::getenv("MT_DEFER_EXPERT_WGRAD");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

// dx rows of each expert (written), and its weight (and bias) gradients (accumulated).
Tensor expert_gemms_backward(const std::vector<Linear>& lin, const Tensor& dy, const Tensor& x,
                             const std::vector<int64_t>& counts, bool grouped_gemm, PassContext& ctx) {
  ScopedOpTimer t(ctx.times, &OpTimes::expert_gemm);
  Tensor dx = Tensor::empty({x.dim(0), x.dim(1)}, dy.dtype(), dy.device());
  if (grouped(lin, grouped_gemm)) {
    std::vector<Tensor*> dw;
    for (const Linear& l : lin) dw.push_back(&l.weight->grad);
    const bool defer = defer_weight_grads() && dy.device() != Device::CPU;
    ops::grouped_linear_backward(dy, x, weights(lin), dw, counts, take_accumulate_dw(lin, counts), dx, defer);
    for (const Linear& l : lin) {
      if (defer) ctx.deferred_grads.push_back(l.weight);
      else ctx.grad_ready(l.weight);
    }
    return dx;
  }
  const std::vector<bool> acc = take_accumulate_dw(lin, counts);
  int64_t off = 0;
  for (size_t i = 0; i < lin.size(); ++i) {
    if (counts[i] > 0) {
      const Tensor dyi = rows(dy, off, counts[i]), xi = rows(x, off, counts[i]);
      Tensor* db = lin[i].bias ? &lin[i].bias->grad : nullptr;
      Tensor dx_rows = rows(dx, off, counts[i]);
      if (lin[i].fp8.on()) {
        Fp8Linear::Backward b;
        Tensor w;
        {
          ScopedOpTimer f(ctx.times, &OpTimes::fp8_cast);
          b = lin[i].fp8.backward_operands(dyi, xi);
          w = lin[i].fp8.forward_weight(lin[i].weight->value, ctx);
        }
        ops::linear_backward_data_into(b.dy_dgrad, w, dx_rows);
        ops::linear_backward_weight(b.dy_wgrad, b.x_wgrad, lin[i].weight->grad, db, acc[i]);
      } else {
        ops::linear_backward_data_into(dyi, lin[i].weight->value, dx_rows);
        ops::linear_backward_weight(dyi, xi, lin[i].weight->grad, db, acc[i]);
      }
    }
    off += counts[i];
    ctx.grad_ready(lin[i].weight);
    ctx.grad_ready(lin[i].bias);
  }
  return dx;
}

}  // namespace

Tensor GroupedExperts::forward(const Tensor& xp, const std::vector<int64_t>& counts, Saved& s, PassContext& ctx) const {
  MT_CHECK(static_cast<int64_t>(counts.size()) == num_local, "experts: {} row counts for {} local experts",
           counts.size(), num_local);
  const int64_t n = xp.dim(0), hidden = xp.dim(1);
  s.xp = xp;
  s.counts = counts;
  s.h = Tensor::empty({n, fc1.empty() ? 0 : fc1[0].weight->value.dim(0)}, xp.dtype(), xp.device());
  expert_gemms(fc1, xp, s.h, counts, grouped_gemm, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    if (n > 0) s.a = swiglu ? ops::swiglu_forward(s.h) : ops::gelu_forward(s.h, openai_gelu);
    else s.a = Tensor::empty({0, local_ffn}, xp.dtype(), xp.device());
  }
  Tensor y = Tensor::empty({n, hidden}, xp.dtype(), xp.device());
  expert_gemms(fc2, s.a, y, counts, grouped_gemm, ctx);
  if (recompute_act) s.a = Tensor();  // [rows, moe_ffn] per layer: rebuilt from h in backward
  return y;
}

Tensor GroupedExperts::backward(const Tensor& dyp, Saved& s, PassContext& ctx) const {
  // The previous MoE layer's deferred weight gradients: at most one layer's inputs stay allocated.
  join_deferred_expert_grads(ctx);
  if (!s.a.defined()) {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    s.a = s.xp.dim(0) > 0 ? (swiglu ? ops::swiglu_forward(s.h) : ops::gelu_forward(s.h, openai_gelu))
                          : Tensor::empty({0, local_ffn}, s.xp.dtype(), s.xp.device());
  }
  const Tensor da = expert_gemms_backward(fc2, dyp, s.a, s.counts, grouped_gemm, ctx);
  Tensor dh;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    if (s.xp.dim(0) > 0) dh = swiglu ? ops::swiglu_backward(da, s.h) : ops::gelu_backward(da, s.h, openai_gelu);
    else dh = s.h;
  }
  Tensor dx = expert_gemms_backward(fc1, dh, s.xp, s.counts, grouped_gemm, ctx);
  s = Saved{};
  return dx;
}

}  // namespace mt::model
