// Activation recomputation: with dropout on, full (uniform and block) and selective
// recomputation give bit-identical losses and gradients to keeping every activation, over
// several optimizer steps and with micro-batches in flight together (as under 1F1B), while
// the layers keep less memory between forward and backward.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "support/tiny_models.h"
#ifdef MT_HAVE_CUDA
#include "support/gpu.h"
#endif

namespace mt::model {
namespace {

TransformerConfig tiny(const std::string& granularity = "", const std::string& method = "", int64_t n = 0) {
  TransformerConfig c = test::tiny_llama_config(4);
  c.qk_layernorm = true;  // the head norms are rebuilt too
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.2f;
  c.init_method_std = 0.1f;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  return c;
}

TransformerConfig tiny_gpt2(const std::string& granularity = "", const std::string& method = "", int64_t n = 0) {
  TransformerConfig c = tiny(granularity, method, n);
  test::use_gpt2_blocks(c);
  c.qk_layernorm = false;
  return c;
}

using test::random_batch;

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;  // per step
  std::vector<size_t> layer_bytes;        // per layer, first micro-batch of the first step
};

size_t total(const std::vector<size_t>& v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

// Steps of two micro-batches each: F0 F1 B1 B0, so two micro-batches' recompute state lives
// side by side. Both dropout streams are in use (the TP stream takes the attention dropout).
TrainRun train(const TransformerConfig& c, int steps = 3) {
  GPTModel m(c);
  optim::OptimizerConfig oc;
  oc.lr = 1e-2f;
  auto opt = optim::make_optimizer(oc, m.params().numel(), m.params().spans(), Device::CPU);
  RngState rng{77, 0}, tp_rng{78, 0};
  TrainRun r;
  for (int step = 0; step < steps; ++step) {
    PassContext ctx;
    ctx.rng = &rng;
    ctx.tp_rng = &tp_rng;
    const Batch b0 = random_batch(2, c.seq_length, c.orig_vocab_size, 10 + 2 * step);
    const Batch b1 = random_batch(2, c.seq_length, c.orig_vocab_size, 11 + 2 * step);
    GPTModel::Saved s0, s1;
    const LossSums l0 = m.forward(b0, s0, ctx), l1 = m.forward(b1, s1, ctx);
    if (step == 0)
      for (const auto& ls : s0.layers) r.layer_bytes.push_back(TransformerLayer::saved_bytes(ls));
    const float scale = static_cast<float>(1.0 / (l0.tokens + l1.tokens));
    m.params().zero_grad();
    m.backward(s1, scale, ctx);
    m.backward(s0, scale, ctx);
    r.losses.push_back(l0.loss_sum);
    r.losses.push_back(l1.loss_sum);
    r.grads.push_back(m.params().grad_buffer().to_vector());
    opt->step(m.params().main_buffer(), m.params().grad_buffer(), 1e-2f, 0.f, {});
    m.params().sync_model_from_main();
  }
  return r;
}

void expect_bit_identical(const TrainRun& got, const TrainRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << what << " loss " << i;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].size(), want.grads[i].size());
    EXPECT_EQ(std::memcmp(got.grads[i].data(), want.grads[i].data(), got.grads[i].size() * sizeof(float)), 0)
        << what << ": gradients differ at step " << i;
  }
}

TEST(Recompute, FullUniformIsBitIdentical) {
  const TrainRun base = train(tiny());
  ASSERT_NE(base.losses[0], base.losses[2]);  // the steps learn something
  for (int64_t n : {1, 2, 3, 4}) expect_bit_identical(train(tiny("full", "uniform", n)), base, "uniform " + std::to_string(n));
}

TEST(Recompute, FullBlockIsBitIdentical) {
  const TrainRun base = train(tiny());
  for (int64_t n : {1, 3, 4}) expect_bit_identical(train(tiny("full", "block", n)), base, "block " + std::to_string(n));
}

TEST(Recompute, SelectiveIsBitIdentical) {
  expect_bit_identical(train(tiny("selective")), train(tiny()), "selective");
  expect_bit_identical(train(tiny_gpt2("selective")), train(tiny_gpt2()), "selective gpt2");
  expect_bit_identical(train(tiny_gpt2("full", "uniform", 2)), train(tiny_gpt2()), "uniform gpt2");
}

TEST(Recompute, EvalPassesAndNoDropoutStreamWork) {
  // Without an RNG (dropout off) and with training off, as the finite-difference checks run.
  auto grads = [](const TransformerConfig& c) {
    GPTModel m(c);
    PassContext ctx;
    ctx.training = false;
    GPTModel::Saved s;
    const LossSums l = m.forward(random_batch(2, c.seq_length, c.orig_vocab_size, 3), s, ctx);
    m.params().zero_grad();
    m.backward(s, static_cast<float>(1.0 / l.tokens), ctx);
    return m.params().grad_buffer().to_vector();
  };
  const auto base = grads(tiny());
  EXPECT_EQ(grads(tiny("full", "uniform", 2)), base);
  EXPECT_EQ(grads(tiny("selective")), base);
}

TEST(Recompute, SavedActivationsShrink) {
  const TransformerConfig c = tiny();
  const TrainRun none = train(c, 1);
  ASSERT_EQ(none.layer_bytes.size(), 4u);
  const size_t input_bytes = static_cast<size_t>(2 * c.seq_length * c.hidden_size) * sizeof(float);
  for (size_t b : none.layer_bytes) EXPECT_GT(b, 8 * input_bytes);

  // Uniform, groups of 2: the first layer of each group holds the group input, nothing else.
  const TrainRun u2 = train(tiny("full", "uniform", 2), 1);
  EXPECT_EQ(u2.layer_bytes, (std::vector<size_t>{input_bytes, 0, input_bytes, 0}));
  // Uniform, groups of 1: every layer holds its input only.
  EXPECT_EQ(train(tiny("full", "uniform", 1), 1).layer_bytes, std::vector<size_t>(4, input_bytes));

  // Block 1: only the first layer is recomputed.
  const TrainRun b1 = train(tiny("full", "block", 1), 1);
  EXPECT_EQ(b1.layer_bytes[0], input_bytes);
  for (size_t i = 1; i < 4; ++i) EXPECT_EQ(b1.layer_bytes[i], none.layer_bytes[i]);

  // Selective: the attention output (one copy, in the row layout linear_proj reads) and its lse are gone.
  const TrainRun sel = train(tiny("selective"), 1);
  const size_t attn_out = static_cast<size_t>(2 * c.seq_length * c.hidden_size) * sizeof(float);
  for (size_t i = 0; i < 4; ++i) EXPECT_LE(sel.layer_bytes[i] + attn_out, none.layer_bytes[i]) << i;
  EXPECT_LT(total(sel.layer_bytes), total(none.layer_bytes));
}

TEST(Recompute, GroupsFollowTheChunk) {
  std::vector<TransformerLayer> ls(5);
  configure_recompute(ls.data(), ls.size(), tiny("full", "uniform", 2));
  for (size_t j = 0; j < 5; ++j) {
    EXPECT_TRUE(ls[j].recompute);
    EXPECT_EQ(ls[j].recompute_group_start, j % 2 == 0) << j;
    EXPECT_EQ(ls[j].recompute_group_end, j % 2 == 1 || j == 4) << j;  // the last group is shorter
  }
  configure_recompute(ls.data(), ls.size(), tiny("full", "block", 2));
  for (size_t j = 0; j < 5; ++j) {
    EXPECT_EQ(ls[j].recompute, j < 2) << j;
    EXPECT_EQ(ls[j].recompute_group_start && ls[j].recompute_group_end, j < 2) << j;
  }
  configure_recompute(ls.data(), ls.size(), tiny("selective"));
  for (const auto& l : ls) EXPECT_FALSE(l.recompute);
}

// Two model chunks on one rank (virtual pipeline stages): block recomputation takes the first
// N layers of each chunk, and the chunks' backward gives the gradients of keeping everything.
TEST(Recompute, BlockAppliesPerModelChunk) {
  auto run = [](const TransformerConfig& c, std::vector<size_t>* bytes) {
    ModelOptions o;
    o.pipeline.chunks = {{0, 2}, {2, 4}};
    GPTModel m(c, o);
    RngState rng{5, 0};
    PassContext ctx;
    ctx.rng = &rng;
    const Batch b = random_batch(2, c.seq_length, c.orig_vocab_size, 9);
    GPTModel::Saved s0, s1;
    LossSums l;
    Tensor y = m.forward_chunk(0, b, Tensor(), s0, ctx, nullptr);
    m.forward_chunk(1, b, y, s1, ctx, &l);
    for (const auto* s : {&s0, &s1})
      for (const auto& ls : s->layers) bytes->push_back(TransformerLayer::saved_bytes(ls));
    m.params().zero_grad();
    Tensor dy = m.backward_chunk(1, s1, Tensor(), static_cast<float>(1.0 / l.tokens), ctx);
    m.backward_chunk(0, s0, dy, 0.f, ctx);
    return m.params().grad_buffer().to_vector();
  };
  std::vector<size_t> none, block;
  const auto want = run(tiny(), &none);
  const auto got = run(tiny("full", "block", 1), &block);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  const TransformerConfig c = tiny();
  const size_t input_bytes = static_cast<size_t>(2 * c.seq_length * c.hidden_size) * sizeof(float);
  ASSERT_EQ(block.size(), 4u);
  EXPECT_EQ(block[0], input_bytes);  // chunk 0, layer 0
  EXPECT_EQ(block[1], none[1]);
  EXPECT_EQ(block[2], input_bytes);  // chunk 1, layer 2
  EXPECT_EQ(block[3], none[3]);
}

// The GPU kernels are deterministic too, so recomputation is bit-identical there (bf16).
TEST(RecomputeGpu, BitIdenticalOnTheGpu) {
#ifndef MT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  auto grads = [](TransformerConfig c) {
    c.hidden_size = 128;
    c.num_attention_heads = 2;  // head dim 64
    c.num_query_groups = 2;
    c.qk_layernorm = false;
    c.ffn_hidden_size = 256;
    c.seq_length = 32;
    c.vocab_size = 256;
    c.orig_vocab_size = 250;
    c.bf16 = true;
    GPTModel m(c);
    m.to_device(Device::CUDA);
    RngState rng{77, 0};
    PassContext ctx;
    ctx.rng = &rng;
    const Batch b0 = random_batch(2, c.seq_length, c.orig_vocab_size, 1);
    const Batch b1 = random_batch(2, c.seq_length, c.orig_vocab_size, 2);
    GPTModel::Saved s0, s1;
    const LossSums l0 = m.forward(b0, s0, ctx), l1 = m.forward(b1, s1, ctx);
    const float scale = static_cast<float>(1.0 / (l0.tokens + l1.tokens));
    m.params().zero_grad();
    m.backward(s1, scale, ctx);
    m.backward(s0, scale, ctx);
    return m.params().grad_buffer().to_device(Device::CPU).to_vector();
  };
  const auto base = grads(tiny());
  for (const TransformerConfig& c : {tiny("full", "uniform", 2), tiny("full", "block", 1), tiny("selective")}) {
    const auto g = grads(c);
    ASSERT_EQ(g.size(), base.size());
    EXPECT_EQ(std::memcmp(g.data(), base.data(), g.size() * sizeof(float)), 0)
        << c.recompute_granularity << " " << c.recompute_method;
  }
#endif
}

}  // namespace
}  // namespace mt::model
