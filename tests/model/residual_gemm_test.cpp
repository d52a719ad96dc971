// The transformer layer's residual adds folded into linear_proj's and linear_fc2's GEMMs, which
// the layer does where the hidden dropout is the identity (0, or not training): activation
// recomputation (full and selective) still rebuilds what the first forward saved, bit for bit,
// on the CPU (fp32) and on the GPU (bf16, where the adds are cuBLASLt epilogues). The attention
// dropout stays on, so the dropout streams are replayed too.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "model/gpt_model.h"
#include "support/tiny_models.h"
#ifdef MT_HAVE_CUDA
#include "support/gpu.h"
#endif

namespace mt::model {
namespace {

TransformerConfig no_hidden_dropout(TransformerConfig c, const std::string& granularity = "",
                                    const std::string& method = "", int64_t n = 0) {
  c.attention_dropout = 0.2f;
  c.hidden_dropout = 0.f;
  c.init_method_std = 0.1f;
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  return c;
}

// Two micro-batches in flight (F0 F1 B1 B0): the losses and the gradients, on `dev`.
struct Pass {
  std::vector<double> losses;
  std::vector<float> grads;
};
Pass two_micro_batches(const TransformerConfig& c, Device dev) {
  GPTModel m(c);
  if (dev != Device::CPU) m.to_device(dev);
  RngState rng{77, 0}, tp_rng{78, 0};
  PassContext ctx;
  ctx.rng = &rng;
  ctx.tp_rng = &tp_rng;
  const Batch b0 = test::random_batch(2, c.seq_length, c.orig_vocab_size, 10);
  const Batch b1 = test::random_batch(2, c.seq_length, c.orig_vocab_size, 11);
  GPTModel::Saved s0, s1;
  const LossSums l0 = m.forward(b0, s0, ctx), l1 = m.forward(b1, s1, ctx);
  m.params().zero_grad();
  const float scale = static_cast<float>(1.0 / (l0.tokens + l1.tokens));
  m.backward(s1, scale, ctx);
  m.backward(s0, scale, ctx);
  Pass p;
  p.losses = {l0.loss_sum, l1.loss_sum};
  p.grads = m.params().grad_buffer().to_device(Device::CPU).to_vector();
  return p;
}

void expect_same(const Pass& got, const Pass& want, const std::string& what) {
  EXPECT_EQ(got.losses, want.losses) << what;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  EXPECT_EQ(std::memcmp(got.grads.data(), want.grads.data(), got.grads.size() * sizeof(float)), 0) << what;
}

// Llama blocks (no biases) and GPT-2 blocks (the bias epilogue with the residual).
TEST(ResidualGemm, RecomputeBitIdenticalWithoutHiddenDropout) {
  TransformerConfig gpt2 = test::tiny_llama_config(4);
  test::use_gpt2_blocks(gpt2);
  for (const TransformerConfig& base : {test::tiny_llama_config(4), gpt2}) {
    const Pass want = two_micro_batches(no_hidden_dropout(base), Device::CPU);
    ASSERT_GT(want.losses[0], 0.0);
    for (const auto& [g, m, n] : {std::tuple<std::string, std::string, int64_t>{"full", "uniform", 2},
                                  {"full", "block", 1},
                                  {"selective", "", 0}})
      expect_same(two_micro_batches(no_hidden_dropout(base, g, m, n), Device::CPU), want,
                  base.normalization + " " + g + " " + m);
  }
}

TEST(ResidualGemmGpu, RecomputeBitIdenticalOnTheGpu) {
#ifndef MT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  TransformerConfig c = test::tiny_llama_config(4);
  c.hidden_size = 128;
  c.num_attention_heads = 2;  // head dim 64
  c.num_query_groups = 2;
  c.ffn_hidden_size = 256;
  c.seq_length = 32;
  c.vocab_size = 256;
  c.orig_vocab_size = 250;
  c.bf16 = true;
  const Pass want = two_micro_batches(no_hidden_dropout(c), Device::CUDA);
  for (const auto& [g, m, n] : {std::tuple<std::string, std::string, int64_t>{"full", "uniform", 2},
                                {"full", "block", 1},
                                {"selective", "", 0}})
    expect_same(two_micro_batches(no_hidden_dropout(c, g, m, n), Device::CUDA), want, g + " " + m);
#endif
}

}  // namespace
}  // namespace mt::model
