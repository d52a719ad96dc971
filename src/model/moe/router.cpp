#include "model/moe/router.h"

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "model/sequence_layout.h"

namespace mt::model {
namespace {

}  // namespace

void TopKRouter::build(ParamStore& ps, const std::string& prefix, const TransformerConfig& c, int64_t layer_index,
                       const TensorParallel* t) {
  moe = c.moe;
  layer = layer_index;
  tp = t;
  weight = &ps.add(prefix + ".weight", {moe.num_experts, c.hidden_size}, Init::Normal, true);
  // Under SP each TP rank routes its own sequence shard: the replicated weight's gradient is
  // partial and summed over TP (Megatron sets sequence_parallel on the router weight).
  weight->sequence_parallel = tp && tp->sp();
  if (moe.enable_expert_bias) expert_bias = &ps.add(prefix + ".expert_bias", {moe.num_experts}, Init::Zeros, false);
  tokens_per_expert.assign(static_cast<size_t>(moe.num_experts), 0.0);
}

ops::RouterSpec TopKRouter::spec(bool training) const {
  ops::RouterSpec sp;
  sp.num_experts = moe.num_experts;
  sp.topk = moe.topk;
  sp.score = moe.score_function == "sigmoid" ? ops::RouterSpec::Score::Sigmoid : ops::RouterSpec::Score::Softmax;
  sp.pre_softmax = moe.pre_softmax;
  sp.scaling = static_cast<float>(moe.topk_scaling_factor);
  sp.num_groups = moe.num_groups;
  sp.group_topk = moe.group_topk;
  sp.sinkhorn = training && moe.load_balancing_type == "sinkhorn";
  return sp;
}

void TopKRouter::forward(const Tensor& x, int64_t B, Saved& s, PassContext& ctx, Tensor& probs, Tensor& map) const {
  ctx.before_use(weight);
  s.x = x;
  s.B = B;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    const Tensor l = ops::linear_forward(x, weight->value, nullptr);
    // Routing runs in fp32 (--moe-router-dtype fp32): the GPU's logits leave the GEMM in the
    // half type and are widened here.
    s.logits = l.dtype() == DType::F32 ? l : Tensor::empty(l.shape(), DType::F32, l.device());
    if (l.dtype() != DType::F32) ops::cast(l, s.logits);
  }
  ScopedOpTimer t(ctx.times, &OpTimes::router);
  // The bias is read from the fp32 main copy: a half copy would round DeepSeek-V3's small steps away.
  ops::moe_route(s.logits, expert_bias ? &expert_bias->main : nullptr, spec(ctx.training), s.probs, s.selected);
  if (moe.capacity_factor > 0) {
    // Megatron's get_capacity over this rank's T * topk assignments.
    const int64_t T = x.dim(0);
    const auto cap = static_cast<int64_t>(
        std::ceil(static_cast<double>(T * moe.topk) / static_cast<double>(moe.num_experts) * moe.capacity_factor));
    map = ops::moe_capacity(s.probs, s.selected, cap, moe.drop_policy == "position", moe.pad_to_capacity);
  } else {
    map = s.selected;
  }
  probs = s.probs;
  s.aux_coef = Tensor();
  s.z_coef = 0.f;
  if (ctx.training && ((moe.uses_aux_loss() && moe.aux_loss_coeff > 0) || moe.z_loss_coeff > 0)) {
    ops::moe_aux_stats(s.logits, spec(true), B, s.stat_sums, s.stat_counts, s.stat_z);
    // No wait here: the dispatch's read of the plan's counts comes first (load_balancing).
    stats_mirror.start({s.stat_sums, s.stat_counts, s.stat_z});
  }
}

void TopKRouter::finish_forward(const std::vector<int32_t>& counts, Saved& s, PassContext& ctx) const {
  if (s.stat_sums.defined()) load_balancing(s, ctx);
  // Training forwards only (recomputation re-runs forward without the loss tracker).
  if (!expert_bias || !ctx.training || !ctx.moe_losses) return;
  for (size_t e = 0; e < counts.size(); ++e) tokens_per_expert[e] += counts[e];
}

// The load-balancing losses (Megatron's switch_load_balancing_loss_func and z_loss_func) from one
// layer's statistics: their values go to the log, their gradient coefficients to Saved.
void TopKRouter::load_balancing(Saved& s, PassContext& ctx) const {
  const Tensor& logits = s.logits;
  const int64_t B = s.B;
  const std::vector<float>& all = stats_mirror.wait();  // sums [B, E], counts [B, E], z [1]
  const size_t be = static_cast<size_t>(s.stat_sums.numel());
  const std::vector<float> sums(all.begin(), all.begin() + be);
  std::vector<float> counts(all.begin() + be, all.begin() + 2 * be);
  const std::vector<float> z(all.begin() + 2 * be, all.end());
  s.stat_sums = s.stat_counts = s.stat_z = Tensor();
  // The gradient coefficients carry this pass's aux grad scale (MoEAuxLossAutoScaler's).
  const double g = ctx.moe_aux_grad_scale;
  // Under SP the TP ranks hold shards of the same sequences, and under CP the CP ranks: token
  // counts are global over TP x CP, score sums stay local (each rank's share of the loss, which
  // the gradients' sum over the group completes).
  const int64_t tp_n = tp && tp->sp() ? tp->size() : 1;
  if (tp_n > 1) tp->comm->all_reduce(counts.data(), counts.size());
  comm::Communicator* cp = ctx.seq && ctx.seq->cp ? ctx.seq->cp->group : nullptr;
  const int64_t cp_n = cp ? cp->size() : 1;
  if (cp_n > 1) cp->all_reduce(counts.data(), counts.size());
  const int64_t tp_cp = tp_n * cp_n;
  const int64_t E = moe.num_experts, k = moe.topk, T_local = logits.dim(0), S_local = T_local / B;
  std::vector<float> coef(static_cast<size_t>(B * E), 0.f);
  if (moe.uses_aux_loss() && moe.aux_loss_coeff > 0) {
    const double c = moe.aux_loss_coeff;
    double value = 0;
    if (moe.load_balancing_type == "aux_loss") {
      const double T = static_cast<double>(T_local * tp_cp);
      const double scale = c * static_cast<double>(E) / (static_cast<double>(k) * T * T);
      for (int64_t e = 0; e < E; ++e) {
        double f = 0, P = 0;
        for (int64_t b = 0; b < B; ++b) f += counts[b * E + e], P += sums[b * E + e];
        value += scale * P * f;
        for (int64_t b = 0; b < B; ++b) coef[b * E + e] = static_cast<float>(g * scale * f);
      }
      if (ctx.moe_losses) ctx.moe_losses->load_balancing += value / c;
    } else {  // seq_aux_loss: the loss per sequence, averaged over the micro-batch's sequences
      const double S = static_cast<double>(S_local * tp_cp);
      const double scale = c * static_cast<double>(E) / (static_cast<double>(k) * S * S) / static_cast<double>(B);
      for (int64_t i = 0; i < B * E; ++i) {
        value += scale * sums[i] * counts[i];
        coef[i] = static_cast<float>(g * scale * counts[i]);
      }
      if (ctx.moe_losses) ctx.moe_losses->seq_load_balancing += value / c;
    }
  }
  if (moe.z_loss_coeff > 0) {
    // Megatron divides the coefficient by the TP x CP size (each rank's z-loss is a mean over its
    // own tokens, averaged over the group rather than summed) and logs z_loss / that coefficient.
    const double cz = moe.z_loss_coeff / static_cast<double>(tp_cp);
    s.z_coef = static_cast<float>(g * cz / static_cast<double>(T_local));
    if (ctx.moe_losses) ctx.moe_losses->z_loss += static_cast<double>(z[0]) / static_cast<double>(T_local);
  }
  // Zeros with the z-loss alone. upload does not wait for the device (Tensor::to_device would).
  s.aux_coef = ops::upload(coef.data(), {B, E}, DType::F32, logits.device());
}

Tensor TopKRouter::backward(const Tensor& dprobs, Saved& s, PassContext& ctx) const {
  Tensor dlogits;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::router);
    dlogits = ops::moe_route_backward(s.logits, s.selected, dprobs, spec(ctx.training));
    if (s.aux_coef.defined()) {
      // Megatron's MoEAuxLossAutoScaler: the auxiliary losses' gradient, weighted like a
      // micro-batch's share of the loss (PassContext::moe_aux_grad_scale).
      ops::moe_aux_backward(s.logits, spec(true), s.B, s.aux_coef, s.z_coef, dlogits);
    }
  }
  Tensor dl = dlogits;
  if (s.x.dtype() != DType::F32) {
    dl = Tensor::empty(dlogits.shape(), s.x.dtype(), dlogits.device());
    ops::cast(dlogits, dl);
  }
  Tensor dx;
  {
    ScopedOpTimer t(ctx.times, &OpTimes::gemm);
    dx = ops::linear_backward(dl, s.x, weight->value, weight->grad, nullptr, true, true);
  }
  ctx.grad_ready(weight);
  if (expert_bias) ctx.grad_ready(expert_bias);
  s = Saved{};
  return dx;
}

void TopKRouter::update_expert_bias(const std::function<void(std::vector<double>&)>& reduce) {
  if (!expert_bias) return;
  reduce(tokens_per_expert);
  // Megatron's get_updated_expert_bias: each bias moves one step of the rate toward balance, on
  // the bias's device (the counts go up without a wait; nothing comes back).
  const std::vector<float> counts(tokens_per_expert.begin(), tokens_per_expert.end());
  const Tensor c = ops::upload(counts.data(), {static_cast<int64_t>(counts.size())}, DType::F32,
                               expert_bias->main.device());
  ops::moe_expert_bias_update(expert_bias->main, c, static_cast<float>(moe.bias_update_rate));
  tokens_per_expert.assign(tokens_per_expert.size(), 0.0);
}

}  // namespace mt::model
