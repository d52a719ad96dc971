// Whole-model checks: gradients against finite differences, over-fitting a fixed batch,
// determinism, and the parameter layout Megatron uses.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "support/tiny_models.h"

namespace mt::model {
namespace {

TransformerConfig tiny_llama() {
  TransformerConfig c = test::tiny_llama_config(2);
  c.rotary_percent = 0.5f;
  c.attention_dropout = 0.f;
  c.hidden_dropout = 0.f;
  c.init_method_std = 0.2f;
  return c;
}

TransformerConfig tiny_gpt2() {
  TransformerConfig c = tiny_llama();
  test::use_gpt2_blocks(c);
  return c;
}

using test::random_batch;

double loss_of(GPTModel& m, const Batch& b) {
  PassContext ctx;
  ctx.training = false;
  GPTModel::Saved s;
  auto r = m.forward(b, s, ctx);
  return r.loss_sum / r.tokens;
}

// Central finite differences on a sample of parameters of every tensor; fp32 forward, so the
// step is large and the tolerance loose, but every parameter tensor's gradient path is exercised.
void check_model_grads(TransformerConfig cfg) {
  GPTModel m(cfg);
  Batch b = random_batch(2, cfg.seq_length, cfg.orig_vocab_size, 7);
  PassContext ctx;
  ctx.training = false;
  GPTModel::Saved s;
  auto r = m.forward(b, s, ctx);
  m.params().zero_grad();
  m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
  for (auto& p : m.params().params()) {
    float* w = p.main.data<float>();
    const float* g = p.grad.data<float>();
    int64_t n = p.numel();
    for (int64_t k = 0; k < 3; ++k) {
      int64_t i = (k * 7919 + 13) % n;
      const float orig = w[i];
      const float eps = 1e-2f;
      w[i] = orig + eps;
      double lp = loss_of(m, b);
      w[i] = orig - eps;
      double lm = loss_of(m, b);
      w[i] = orig;
      double num = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(g[i], num, 2e-3 + 2e-2 * std::fabs(num)) << p.name << "[" << i << "]";
    }
  }
}

TEST(GPTModel, LlamaGradientsMatchFiniteDifferences) { check_model_grads(tiny_llama()); }
TEST(GPTModel, Gpt2GradientsMatchFiniteDifferences) { check_model_grads(tiny_gpt2()); }

// zero_grad leaves the gradients only weight GEMMs write (Linear weights, the untied output
// layer) and their first write of the step overwrites: over stale values, two accumulated
// backward passes give the same bits as from a zeroed buffer; a gradient no GEMM wrote is zeroed
// by zero_unwritten_grads, and the others (norms, embeddings, biases) by zero_grad itself.
TEST(GPTModel, ZeroGradLeavesGemmGradientsToTheirFirstWrite) {
  for (const TransformerConfig& cfg : {tiny_llama(), tiny_gpt2()}) {
    GPTModel m(cfg);
    const Batch b1 = random_batch(2, cfg.seq_length, cfg.orig_vocab_size, 5);
    const Batch b2 = random_batch(2, cfg.seq_length, cfg.orig_vocab_size, 6);
    auto two_passes = [&] {
      for (const Batch* b : {&b1, &b2}) {
        PassContext ctx;
        GPTModel::Saved s;
        auto r = m.forward(*b, s, ctx);
        m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
      }
      m.params().zero_unwritten_grads();
      return m.params().grad_buffer().to_vector();
    };
    m.params().grad_buffer().zero_();  // the reference: accumulate from zero
    const std::vector<float> want = two_passes();
    m.params().grad_buffer().fill_(7.f);  // stale values everywhere
    m.params().zero_grad();
    int gemm_only = 0;
    for (const auto& p : m.params().params()) {
      gemm_only += p.gemm_only_grad;
      const std::vector<float> g = p.grad.to_vector();
      EXPECT_EQ(g[0], p.gemm_only_grad ? 7.f : 0.f) << p.name;
    }
    EXPECT_GE(gemm_only, 4 * cfg.num_layers) << "every layer's four linear weights";
    const std::vector<float> got = two_passes();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
    m.params().grad_buffer().fill_(7.f);
    m.params().zero_grad();
    m.params().zero_unwritten_grads();  // a step whose backward wrote nothing
    for (float g : m.params().grad_buffer().to_vector()) ASSERT_EQ(g, 0.f);
  }
}

TEST(GPTModel, ParameterNamesFollowMegatronCore) {
  GPTModel m(tiny_llama());
  auto& ps = m.params();
  ASSERT_NE(ps.find("embedding.word_embeddings.weight"), nullptr);
  ASSERT_NE(ps.find("decoder.layers.1.self_attention.linear_qkv.weight"), nullptr);
  ASSERT_NE(ps.find("decoder.layers.1.mlp.linear_fc1.weight"), nullptr);
  ASSERT_NE(ps.find("decoder.final_layernorm.weight"), nullptr);
  ASSERT_NE(ps.find("output_layer.weight"), nullptr);
  // qkv rows: groups * (q_per_group + 2) * head_dim = 2 * (2 + 2) * 4.
  EXPECT_EQ(ps.find("decoder.layers.0.self_attention.linear_qkv.weight")->shape, (Shape{32, 16}));
  EXPECT_EQ(ps.find("decoder.layers.0.mlp.linear_fc1.weight")->shape, (Shape{48, 16}));
  EXPECT_EQ(ps.numel(), m.config().num_parameters());
  GPTModel g(tiny_gpt2());
  EXPECT_EQ(g.params().find("output_layer.weight"), nullptr);  // tied
  EXPECT_EQ(g.params().numel(), g.config().num_parameters());
}

TEST(GPTModel, ScaledInitForOutputProjections) {
  TransformerConfig c = tiny_llama();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 128;
  GPTModel m(c);
  auto stdev = [](const Param& p) {
    auto v = p.main.to_vector();
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  double qkv = stdev(*m.params().find("decoder.layers.0.self_attention.linear_qkv.weight"));
  double proj = stdev(*m.params().find("decoder.layers.0.self_attention.linear_proj.weight"));
  EXPECT_NEAR(qkv, 0.2, 0.02);
  EXPECT_NEAR(proj, 0.2 / std::sqrt(2.0 * 2), 0.01);
  EXPECT_EQ(m.params().find("decoder.layers.0.input_layernorm.weight")->main.to_vector()[0], 1.f);
}

TEST(GPTModel, TinyModelOverfitsFixedBatch) {
  TransformerConfig c = tiny_llama();
  c.init_method_std = 0.02f;
  GPTModel m(c);
  Batch b = random_batch(2, c.seq_length, c.orig_vocab_size, 3);
  optim::OptimizerConfig oc;
  oc.lr = 1e-2f;
  oc.weight_decay = 0.f;
  auto opt = optim::make_optimizer(oc, m.params().numel(), m.params().spans(), Device::CPU);
  double first = 0, last = 0;
  for (int it = 0; it < 150; ++it) {
    PassContext ctx;
    GPTModel::Saved s;
    auto r = m.forward(b, s, ctx);
    m.params().zero_grad();
    m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
    opt->step(m.params().main_buffer(), m.params().grad_buffer(), 1e-2f, 0.f, {});
    m.params().sync_model_from_main();
    if (it == 0) first = r.loss_sum / r.tokens;
    last = r.loss_sum / r.tokens;
  }
  EXPECT_GT(first, 3.0);
  EXPECT_LT(last, 0.1) << "first " << first;
}

TEST(GPTModel, SameSeedSameLossesWithDropout) {
  auto run = [](uint64_t seed) {
    TransformerConfig c = tiny_llama();
    c.attention_dropout = 0.1f;
    c.hidden_dropout = 0.1f;
    c.seed = seed;
    GPTModel m(c);
    Batch b = random_batch(2, c.seq_length, c.orig_vocab_size, 5);
    RngState rng{seed, 0};
    std::vector<double> out;
    for (int i = 0; i < 3; ++i) {
      PassContext ctx;
      ctx.rng = &rng;
      GPTModel::Saved s;
      out.push_back(m.forward(b, s, ctx).loss_sum);
    }
    return out;
  };
  auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]);  // dropout masks change between passes
}

TEST(GPTModel, Bf16ModelCopyIsRounded) {
  TransformerConfig c = tiny_llama();
  c.bf16 = true;
  GPTModel m(c);
  const Param* p = m.params().find("decoder.layers.0.mlp.linear_fc1.weight");
  auto main = p->main.to_vector(), val = p->value.to_vector();
  for (size_t i = 0; i < main.size(); ++i) ASSERT_EQ(val[i], round_bf16(main[i]));
  Batch b = random_batch(2, c.seq_length, c.orig_vocab_size, 1);
  EXPECT_TRUE(std::isfinite(loss_of(m, b)));
}

TEST(ModelConfig, ValidationNamesTheFlag) {
  TransformerConfig c = tiny_llama();
  c.num_query_groups = 3;
  try {
    c.finalize();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-query-groups"), std::string::npos);
  }
  TransformerConfig d = tiny_llama();
  d.hidden_size = 18;
  d.kv_channels = 0;
  EXPECT_THROW(d.finalize(), Error);
  EXPECT_EQ(padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 128, 2), 50432);
}

}  // namespace
}  // namespace mt::model
