#include "model/transformer_layer.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {
namespace {

// Whether a residual add can move into the GEMM before it (Linear::forward's residual): the
// hidden dropout between them must be the identity (it applies to the GEMM's output before the
// add; Dropout::forward's condition), the Linear must fuse (no TP: a row-parallel output is
// partial until its reduction), and the CPU must not be emulating half storage, where the unfused
// path keeps the residual stream's rounding as it was (the CPU-vs-GPU tracking tests' reference).
bool residual_in_gemm(const Dropout& d, const Linear& l, const Tensor& x, Half half, const PassContext& ctx) {
  const bool dropout_off = !(ctx.training && d.p > 0.f);
  return dropout_off && l.fuses_residual() && !emulates_half(x, half);
}

}  // namespace

void TransformerLayer::build(ParamStore& ps, int64_t index, const TransformerConfig& c, const RopeTables* rope,
                             const TensorParallel* tp, const ExpertParallel* ep) {
  cfg = c;
  number = index;
  const std::string prefix = "decoder.layers." + std::to_string(index);
  // Megatron-core names: input_layernorm, self_attention, pre_mlp_layernorm, mlp.
  input_norm.build(ps, prefix + ".input_layernorm", c, tp);
  attn.build(ps, prefix + ".self_attention", c, rope, tp);
  pre_mlp_norm.build(ps, prefix + ".pre_mlp_layernorm", c, tp);
  is_moe = c.moe.is_moe_layer(index);
  if (is_moe) moe.build(ps, prefix + ".mlp", c, index, tp, ep);
  else mlp.build(ps, prefix + ".mlp", c, tp);
  attn_drop.p = c.hidden_dropout;
  mlp_drop.p = c.hidden_dropout;
  // Under SP the residual stream is a sequence shard: its dropout masks differ per TP rank.
  attn_drop.tp_region = mlp_drop.tp_region = tp && tp->sp();
}

// What a full-recomputation group keeps from its forward to its backward.
struct RecomputeGroup {
  Tensor input;  // the group's first layer's input; moved into its rebuilt Saved
  // --distribute-saved-activations: `input` is this TP rank's [1, numel/TP] piece of a tensor
  // of shape `input_shape`, gathered over `tp` before the re-run.
  const TensorParallel* tp = nullptr;
  Shape input_shape;
  bool training = true;
  // The dropout streams as the group's forward found them, and their offsets when it ended:
  // the re-run draws from copies of the former and must end at the latter.
  std::optional<RngState> rng, tp_rng;
  uint64_t rng_end = 0, tp_rng_end = 0;
  std::shared_ptr<const SequenceLayout> seq;    // the forward's token layout, for the re-run
  std::vector<const TransformerLayer*> layers;  // in forward order
  std::vector<TransformerLayer::Saved> saved;   // rebuilt, handed out one by one in backward
  bool rebuilt = false;

  void rebuild(int64_t S, int64_t B, PassContext& ctx) {
    RngState r = rng.value_or(RngState{}), tr = tp_rng.value_or(RngState{});
    PassContext rc;
    rc.training = training;
    rc.rng = rng ? &r : nullptr;
    rc.tp_rng = tp_rng ? &tr : nullptr;
    rc.times = ctx.times;
    rc.hooks = ctx.hooks;  // before_use: the parameters are read again
    rc.moe_aux_grad_scale = ctx.moe_aux_grad_scale;  // the rebuilt routers' aux gradient weight
    rc.recomputing = true;
    rc.seq = seq;
    saved.resize(layers.size());
    Tensor x = std::move(input);
    if (tp) x = all_gather_rows(x, *tp).view(input_shape);
    for (size_t j = 0; j < layers.size(); ++j) x = layers[j]->forward_layer(x, S, B, saved[j], rc);
    MT_CHECK((!rng || r.offset == rng_end) && (!tp_rng || tr.offset == tp_rng_end),
             "recomputed forward drew other dropout offsets than the first forward");
    rebuilt = true;
  }
};

Tensor TransformerLayer::forward(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  if (!recompute) return forward_layer(x, S, B, s, ctx);
  if (recompute_group_start) {
    auto g = std::make_shared<RecomputeGroup>();
    g->input = x;
    const TensorParallel* tp = attn.tp;
    if (cfg.distribute_saved_activations && tp && tp->on() && x.numel() % tp->size() == 0) {
      // Keep only this rank's equal piece of the flattened input (a copy: x itself is freed).
      g->tp = tp;
      g->input_shape = x.shape();
      g->input = x.view({tp->size(), x.numel() / tp->size()}).slice(tp->rank(), 1).clone();
    }
    g->training = ctx.training;
    if (ctx.rng) g->rng = *ctx.rng;
    if (ctx.tp_rng) g->tp_rng = *ctx.tp_rng;
    g->seq = ctx.seq;
    ctx.recompute_group = std::move(g);
  }
  MT_CHECK(ctx.recompute_group != nullptr, "a recomputed layer's forward outside its recompute group");
  RecomputeGroup& g = *ctx.recompute_group;
  s.group = ctx.recompute_group;
  s.group_index = g.layers.size();
  g.layers.push_back(this);
  Tensor y;
  {
    Saved scratch;  // what backward would need: freed as soon as the layer is done
    y = forward_layer(x, S, B, scratch, ctx);
  }
  if (recompute_group_end) {
    if (ctx.rng) g.rng_end = ctx.rng->offset;
    if (ctx.tp_rng) g.tp_rng_end = ctx.tp_rng->offset;
    ctx.recompute_group.reset();
  }
  return y;
}

Tensor TransformerLayer::backward(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  if (s.group) {
    // Keeps the group alive to the end of this call: the first layer's backward frees it.
    const std::shared_ptr<RecomputeGroup> g = std::move(s.group);
    const size_t i = s.group_index;
    if (!g->rebuilt) g->rebuild(S, B, ctx);
    MT_CHECK(i < g->layers.size() && g->layers[i] == this, "recompute group does not hold this layer");
    s = std::move(g->saved[i]);
  }
  return backward_layer(dy, S, B, s, ctx);
}

// Where residual_in_gemm, a residual add is linear_proj's (linear_fc2's) GEMM epilogue; else the
// attention residual is added inside pre_mlp_norm (forward_residual) and the MLP's by its own
// kernel. Both ways save the same tensors (pre_mlp_norm keeps h): backward and recomputation
// are the same.
Tensor TransformerLayer::forward_layer(const Tensor& x, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  // FP8 current scaling: the norms find the amax of linear_qkv's and linear_fc1's inputs in their
  // own passes (model/fp8.h, fp8_producer_amax). Undefined where the linear would not take it.
  const int64_t rows = x.numel() / x.dim(-1);
  auto amax_for = [&](const Linear& l) {
    return l.wants_input_amax(rows, x.device(), ctx) ? Tensor::empty({1}, DType::F32, x.device()) : Tensor();
  };
  auto opt = [](Tensor& t) { return t.defined() ? &t : nullptr; };
  Tensor xn_amax = amax_for(attn.qkv), hn_amax = is_moe ? Tensor() : amax_for(mlp.fc1);
  const Tensor xn = input_norm.forward(x, s.n1, ctx, opt(xn_amax));
  Tensor h;   // the residual stream after attention: x + dropout(a)
  Tensor hn;  // its norm, the MLP's input
  if (residual_in_gemm(attn_drop, attn.proj, x, cfg.half(), ctx)) {
    s.d1 = {};  // the identity: no mask drawn
    h = attn.forward(xn, S, B, s.attn, ctx, &x, opt(xn_amax));
    hn = pre_mlp_norm.forward(h, s.n2, ctx, opt(hn_amax));
  } else {
    const Tensor a = attn.forward(xn, S, B, s.attn, ctx, nullptr, opt(xn_amax));
    hn = pre_mlp_norm.forward_residual(attn_drop.forward(a, s.d1, ctx), x, h, cfg.half(), s.n2, ctx, opt(hn_amax));
  }
  if (!is_moe && residual_in_gemm(mlp_drop, mlp.fc2, h, cfg.half(), ctx)) {
    s.d2 = {};
    return mlp.forward(hn, s.mlp, ctx, &h, opt(hn_amax));
  }
  Tensor m;
  if (!is_moe) {
    m = mlp.forward(hn, s.mlp, ctx, nullptr, opt(hn_amax));
  } else if (cfg.recomputes("moe")) {
    MoELayer::Saved scratch;  // freed here: backward re-runs the layer from its input
    m = moe.forward(hn, B, scratch, ctx);
    s.moe_input = hn;
  } else {
    m = moe.forward(hn, B, s.moe, ctx);
  }
  Tensor y = mlp_drop.forward(m, s.d2, ctx);
  {
    ScopedOpTimer t(ctx.times, &OpTimes::elementwise);
    ops::add_inplace(y, h);
    round_to_half_inplace(y, cfg.half());
  }
  return y;
}

Tensor TransformerLayer::backward_layer(const Tensor& dy, int64_t S, int64_t B, Saved& s, PassContext& ctx) const {
  // dy flows to h directly (residual) and through mlp_drop -> mlp -> pre_mlp_norm.
  // The residual gradients (dy into dh, dh into dx) are added inside the norms' backward.
  const Tensor dm = mlp_drop.backward(dy, s.d2, ctx.times);
  if (s.moe_input.defined()) {
    // The MoE layer's recomputation: the same routing (deterministic), no statistics recorded.
    PassContext rc = ctx;
    rc.moe_losses = nullptr;
    rc.recomputing = true;
    moe.forward(s.moe_input, B, s.moe, rc);
    s.moe_input = Tensor();
  }
  Tensor dh = pre_mlp_norm.backward(is_moe ? moe.backward(dm, s.moe, ctx) : mlp.backward(dm, s.mlp, ctx), s.n2, ctx, &dy);
  // fp16 stores the residual stream's gradient in fp16 too: where a too-large loss scale
  // overflows (and a too-small one underflows), which is what loss scaling is about. bf16's
  // range needs no such emulation (and its runs stay as they were).
  if (cfg.fp16) round_to_half_inplace(dh, Half::FP16);
  Tensor dx = input_norm.backward(attn.backward(attn_drop.backward(dh, s.d1, ctx.times), S, B, s.attn, ctx), s.n1,
                                  ctx, &dh);
  if (cfg.fp16) round_to_half_inplace(dx, Half::FP16);
  return dx;
}

size_t TransformerLayer::saved_bytes(const Saved& s) {
  std::vector<const void*> seen;
  size_t total = 0;
  auto add = [&](const Tensor& t) {
    if (!t.defined() || t.numel() == 0) return;
    const void* p = t.raw();
    if (std::find(seen.begin(), seen.end(), p) != seen.end()) return;  // same storage, counted
    seen.push_back(p);
    total += t.nbytes();
  };
  for (const Norm::Saved* n : {&s.n1, &s.n2, &s.attn.qn, &s.attn.kn})
    for (const Tensor* t : {&n->x, &n->mean, &n->rstd}) add(*t);
  const auto& a = s.attn;
  for (const Tensor* t : {&a.x, &a.q, &a.k, &a.v, &a.out, &a.lse}) add(*t);
  for (const Tensor* t : {&s.mlp.x, &s.mlp.h, &s.mlp.a}) add(*t);
  const auto& m = s.moe;
  for (const Tensor* t : {&m.router.x, &m.router.logits, &m.router.selected, &m.router.probs, &m.dispatch.token_rows, &m.dispatch.probs, &m.dispatch.yp,
                          &m.experts.xp, &m.experts.h, &m.experts.a, &m.shared.x, &m.shared.h, &m.shared.a, &m.gate})
    add(*t);
  add(s.moe_input);  // --recompute-modules moe: the MoE layer keeps its input only
  if (s.group && s.group_index == 0) add(s.group->input);
  return total;
}

void configure_recompute(TransformerLayer* layers, size_t n, const TransformerConfig& c) {
  const bool full = c.recompute_full();
  const bool uniform = c.recompute_method == "uniform";
  if (full)
    MT_CHECK((uniform || c.recompute_method == "block") && c.recompute_num_layers >= 1,
             "full recomputation needs method uniform or block and num_layers >= 1 (got '{}', {})",
             c.recompute_method, c.recompute_num_layers);
  const size_t N = full ? static_cast<size_t>(c.recompute_num_layers) : 0;
  for (size_t j = 0; j < n; ++j) {
    TransformerLayer& l = layers[j];
    if (!full) {
      l.recompute = l.recompute_group_start = l.recompute_group_end = false;
    } else if (uniform) {  // every layer, in groups of N from the chunk's first layer
      l.recompute = true;
      l.recompute_group_start = j % N == 0;
      l.recompute_group_end = j % N == N - 1 || j + 1 == n;
    } else {  // block: the first N layers, each its own group; the rest keep their activations
      l.recompute = l.recompute_group_start = l.recompute_group_end = j < N;
    }
  }
}

}  // namespace mt::model
