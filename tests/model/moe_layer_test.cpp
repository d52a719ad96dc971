// MoE layers in a whole model: every parameter's gradient (routed experts, router, shared expert
// and its gate) against finite differences, with and without the load-balancing losses; a
// one-expert MoE equals the dense MLP; token dropping; the expert-bias update.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model/moe/router.h"
#include "support/tiny_models.h"

namespace mt::model {
namespace {

TransformerConfig tiny_moe(int64_t experts = 4, int64_t topk = 2) {
  TransformerConfig c = test::tiny_llama_config(2);
  c.attention_dropout = 0.f;
  c.hidden_dropout = 0.f;
  c.init_method_std = 0.2f;
  c.moe.num_experts = experts;
  c.moe.topk = topk;
  c.moe.moe_ffn_hidden_size = 12;
  c.moe.layer_pattern = {true, false};  // layer 0 MoE, layer 1 dense
  return c;
}

// The objective backward differentiates: the mean token loss plus, in training, the auxiliary
// losses at grad scale 1 (their logged values times their coefficients).
double objective(GPTModel& m, const Batch& b, bool training, GPTModel::Saved* keep = nullptr) {
  PassContext ctx;
  ctx.training = training;
  MoELossSums aux;
  ctx.moe_losses = &aux;
  GPTModel::Saved s;
  auto r = m.forward(b, keep ? *keep : s, ctx);
  const auto& moe = m.config().moe;
  return r.loss_sum / r.tokens + moe.aux_loss_coeff * (aux.load_balancing + aux.seq_load_balancing) +
         moe.z_loss_coeff * aux.z_loss;
}

void check_grads(const TransformerConfig& cfg, bool training) {
  GPTModel m(cfg);
  Batch b = test::random_batch(2, cfg.seq_length, cfg.orig_vocab_size, 7);
  GPTModel::Saved s;
  PassContext ctx;
  ctx.training = training;
  MoELossSums aux;
  ctx.moe_losses = &aux;
  auto r = m.forward(b, s, ctx);
  m.params().zero_grad();
  m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
  m.params().zero_unwritten_grads();
  int checked = 0;
  for (auto& p : m.params().params()) {
    if (p.name.find("expert_bias") != std::string::npos) continue;  // not trained by gradients
    float* w = p.main.data<float>();
    const float* g = p.grad.data<float>();
    const int64_t n = p.numel();
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t i = (k * 7919 + 13) % n;
      const float orig = w[i];
      const float eps = 2e-3f;
      w[i] = orig + eps;
      m.params().sync_model_from_main();
      const double lp = objective(m, b, training);
      w[i] = orig - eps;
      m.params().sync_model_from_main();
      const double lm = objective(m, b, training);
      w[i] = orig;
      m.params().sync_model_from_main();
      const double num = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(g[i], num, 2e-3 + 3e-2 * std::fabs(num)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

TEST(MoELayer, GradientsMatchFiniteDifferences) { check_grads(tiny_moe(), false); }

TEST(MoELayer, SharedExpertWithGateGradients) {
  TransformerConfig c = tiny_moe();
  c.moe.shared_expert_intermediate_size = 20;
  c.moe.shared_expert_gate = true;
  c.moe.pre_softmax = true;
  check_grads(c, false);
}

TEST(MoELayer, SigmoidTopOneGradients) {
  TransformerConfig c = tiny_moe(4, 1);
  c.moe.score_function = "sigmoid";
  c.moe.topk_scaling_factor = 2.0;
  check_grads(c, false);
}

// Training adds the load-balancing terms' gradient (aux loss and z-loss, then the per-sequence
// aux loss): the objective includes their values.
TEST(MoELayer, AuxiliaryLossGradients) {
  TransformerConfig c = tiny_moe();
  c.moe.aux_loss_coeff = 0.5;
  c.moe.z_loss_coeff = 0.1;
  check_grads(c, true);
  c.moe.load_balancing_type = "seq_aux_loss";
  c.moe.score_function = "sigmoid";
  check_grads(c, true);
}

// One expert, top-1, softmax: its weight is exactly 1, so the layer is the dense MLP with the
// expert's weights.
TEST(MoELayer, OneExpertEqualsTheDenseMlp) {
  TransformerConfig moe = tiny_moe(1, 1);
  moe.moe.moe_ffn_hidden_size = moe.ffn_hidden_size;
  TransformerConfig dense = moe;
  dense.moe = MoEConfig{};
  GPTModel a(moe), d(dense);
  for (auto& p : d.params().params()) {
    std::string name = p.name;
    const auto at = name.find("layers.0.mlp.");
    if (at != std::string::npos) name.replace(at, 13, "layers.0.mlp.experts.local_experts.0.");
    Param* q = a.params().find(name);
    ASSERT_NE(q, nullptr) << name;
    q->main.copy_from(p.main);
  }
  a.params().sync_model_from_main();
  Batch b = test::random_batch(2, moe.seq_length, moe.orig_vocab_size, 5);
  EXPECT_NEAR(objective(a, b, false), objective(d, b, false), 1e-6);
}

TEST(MoELayer, TokenDroppingKeepsGradientsRight) {
  TransformerConfig c = tiny_moe();
  c.moe.capacity_factor = 0.5;
  check_grads(c, false);
  c.moe.pad_to_capacity = true;
  c.moe.drop_policy = "position";
  check_grads(c, false);
}

// --recompute-modules moe_act / moe: the same gradients, bit for bit, keeping less.
TEST(MoELayer, RecomputedActivationOrLayerGivesTheSameGradients) {
  auto grads = [](const std::vector<std::string>& modules, size_t* saved) {
    TransformerConfig c = tiny_moe();
    c.moe.aux_loss_coeff = 0.1;
    c.moe.z_loss_coeff = 0.01;
    c.moe.shared_expert_intermediate_size = 8;
    if (modules == std::vector<std::string>{"full"}) {
      c.recompute_granularity = "full";  // whole layers rebuilt from their input
      c.recompute_method = "uniform";
      c.recompute_num_layers = 2;
    } else if (!modules.empty()) {
      c.recompute_granularity = "selective";
      c.recompute_modules = modules;
    }
    GPTModel m(c);
    Batch b = test::random_batch(2, c.seq_length, c.orig_vocab_size, 3);
    PassContext ctx;
    MoELossSums aux;
    ctx.moe_losses = &aux;
    ctx.moe_aux_grad_scale = 0.5f;  // the rebuilt forward must weigh the aux losses alike
    GPTModel::Saved s;
    auto r = m.forward(b, s, ctx);
    *saved = TransformerLayer::saved_bytes(s.layers[0]);
    m.params().zero_grad();
    m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
    m.params().zero_unwritten_grads();
    return m.params().grad_buffer().to_vector();
  };
  size_t plain = 0, act = 0, layer = 0;
  const auto g0 = grads({}, &plain);
  EXPECT_EQ(grads({"core_attn", "moe_act"}, &act), g0);
  EXPECT_EQ(grads({"moe"}, &layer), g0);
  size_t full = 0;
  EXPECT_EQ(grads({"full"}, &full), g0);
  EXPECT_LT(act, plain);
  EXPECT_LT(layer, act);
}

TEST(MoELayer, ExpertBiasMovesTowardBalance) {
  TransformerConfig c = tiny_moe(4, 1);
  c.moe.score_function = "sigmoid";
  c.moe.enable_expert_bias = true;
  c.moe.bias_update_rate = 0.25;
  GPTModel m(c);
  Batch b = test::random_batch(2, c.seq_length, c.orig_vocab_size, 9);
  objective(m, b, true);
  TopKRouter* router = nullptr;
  m.for_each_moe_layer([&](MoELayer& l) { router = &l.router; });
  ASSERT_NE(router, nullptr);
  const std::vector<double> counts = router->tokens_per_expert;
  double total = 0;
  for (double x : counts) total += x;
  EXPECT_EQ(total, 2.0 * c.seq_length);  // every token went to one expert
  router->update_expert_bias([](std::vector<double>&) {});
  const float* bias = router->expert_bias->main.data<float>();
  for (size_t e = 0; e < counts.size(); ++e) {
    const double off = total / 4 - counts[e];
    EXPECT_FLOAT_EQ(bias[e], off > 0 ? 0.25f : off < 0 ? -0.25f : 0.f) << e;
  }
  EXPECT_EQ(router->tokens_per_expert, std::vector<double>(4, 0.0));
}

}  // namespace
}  // namespace mt::model
