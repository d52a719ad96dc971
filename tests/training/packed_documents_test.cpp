// Packed documents (--reset-position-ids --reset-attention-mask): a sample holding several
// documents gives the loss and the gradients of those documents run one by one, for the Llama
// blocks (RoPE) and the GPT-2 blocks (learned positions), with micro-batches of one and two
// samples; and the masks are Megatron's (data::mark_documents). On the GPU (bf16, head dim 64 and
// 128: the ranged tensor-core attention kernels) a packed sample matches its documents within
// bf16's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/packed_documents.h"
#include "support/gpu.h"
#include "support/tiny_models.h"

namespace mt::model {
namespace {

constexpr int32_t kEod = 29;

struct Result {
  double loss = 0, tokens = 0;
  std::vector<float> grads;
};

// Forward and backward of `batches` in turn (their gradients summed, each loss unscaled).
Result run(GPTModel& m, const std::vector<Batch>& batches) {
  Result r;
  m.params().zero_grad();
  for (const Batch& b : batches) {
    PassContext ctx;
    ctx.training = true;
    GPTModel::Saved s;
    const LossSums l = m.forward(b, s, ctx);
    r.loss += l.loss_sum;
    r.tokens += l.tokens;
    m.backward(s, 1.f, ctx);
  }
  m.params().zero_unwritten_grads();
  r.grads = m.params().grad_buffer().to_device(Device::CPU).to_vector();
  return r;
}

// Samples of `S` tokens whose documents each end with EOD.
Batch packed(const std::vector<std::vector<int32_t>>& doc_lengths, int64_t S) {
  Batch b = test::random_batch(static_cast<int64_t>(doc_lengths.size()), S, 28, 7);
  for (size_t i = 0; i < doc_lengths.size(); ++i) {
    int64_t t = 0;
    for (int32_t len : doc_lengths[i]) {
      t += len;
      b.tokens[i * static_cast<size_t>(S) + static_cast<size_t>(t - 1)] = kEod;
    }
  }
  data::mark_documents(b.tokens, b.B, S, kEod, true, true, b.position_ids, b.cu_seqlens);
  return b;
}

// Each document of a packed batch as a batch of its own.
std::vector<Batch> documents(const Batch& p) {
  std::vector<Batch> out;
  for (size_t d = 0; d + 1 < p.cu_seqlens.size(); ++d) {
    const size_t a = static_cast<size_t>(p.cu_seqlens[d]), e = static_cast<size_t>(p.cu_seqlens[d + 1]);
    Batch b;
    b.B = 1;
    b.S = static_cast<int64_t>(e - a);
    b.tokens.assign(p.tokens.begin() + a, p.tokens.begin() + e);
    b.labels.assign(p.labels.begin() + a, p.labels.begin() + e);
    b.loss_mask.assign(p.loss_mask.begin() + a, p.loss_mask.begin() + e);
    out.push_back(std::move(b));
  }
  return out;
}

void expect_packed_equals_documents(TransformerConfig c, const std::vector<std::vector<int32_t>>& docs) {
  c.seq_length = 16;
  c.max_position_embeddings = 16;
  c.attention_dropout = c.hidden_dropout = 0.f;
  c.finalize();
  GPTModel m(c);
  const Batch p = packed(docs, 16);
  const Result whole = run(m, {p}), apart = run(m, documents(p));
  EXPECT_EQ(whole.tokens, apart.tokens);
  EXPECT_NEAR(whole.loss, apart.loss, 1e-5 * std::fabs(apart.loss));
  double worst = 0, largest = 0;
  for (size_t i = 0; i < whole.grads.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(whole.grads[i]) - apart.grads[i]));
    largest = std::max(largest, std::fabs(static_cast<double>(apart.grads[i])));
  }
  EXPECT_GT(largest, 0.0);
  EXPECT_LT(worst, 2e-6 * largest) << "largest gradient " << largest;
}

TEST(PackedDocuments, LlamaSampleEqualsItsDocuments) {
  TransformerConfig c = test::tiny_llama_config(2);
  expect_packed_equals_documents(c, {{5, 1, 10}});
  expect_packed_equals_documents(c, {{3, 13}, {16}});
}

TEST(PackedDocuments, Gpt2SampleEqualsItsDocuments) {
  TransformerConfig c = test::tiny_llama_config(2);
  test::use_gpt2_blocks(c);
  expect_packed_equals_documents(c, {{7, 9}, {2, 2, 12}});
}

// The GPU: a Llama model in bf16 whose packed samples (one, or two: RoPE then runs per sample)
// give their documents' loss and gradients. The packed run attends through the ranged kernels,
// the documents through the plain ones, so both sides round alike only up to bf16 (the GEMMs
// also see other row counts).
TEST(PackedDocumentsGpu, LlamaSampleEqualsItsDocuments) {
#ifndef MT_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  test::gpu();
  for (const int64_t head_dim : {64, 128})
    for (const std::vector<std::vector<int32_t>>& docs :
         {std::vector<std::vector<int32_t>>{{40, 1, 87}}, {{64, 64}}, {{1, 126, 1}}, {{40, 1, 87}, {100, 28}}}) {
      SCOPED_TRACE(testing::Message() << "head dim " << head_dim << ", " << docs.size() << " samples, "
                                      << docs[0].size() << " documents in the first");
      TransformerConfig c = test::tiny_llama_config(2);
      c.num_attention_heads = 2;
      c.num_query_groups = 1;
      c.hidden_size = 2 * head_dim;
      c.ffn_hidden_size = 256;
      c.vocab_size = 256;
      c.orig_vocab_size = 250;
      c.seq_length = c.max_position_embeddings = 128;
      c.attention_dropout = c.hidden_dropout = 0.f;
      c.bf16 = true;
      c.finalize();
      GPTModel m(c);
      m.to_device(Device::CUDA);
      const Batch p = packed(docs, 128);
      const Result whole = run(m, {p}), apart = run(m, documents(p));
      EXPECT_EQ(whole.tokens, apart.tokens);
      EXPECT_NEAR(whole.loss, apart.loss, 3e-3 * std::fabs(apart.loss));
      double num = 0, den = 0;
      for (size_t i = 0; i < whole.grads.size(); ++i) {
        const double d = static_cast<double>(whole.grads[i]) - apart.grads[i];
        num += d * d;
        den += static_cast<double>(apart.grads[i]) * apart.grads[i];
      }
      EXPECT_GT(den, 0.0);
      EXPECT_LT(std::sqrt(num / den), 3e-2) << "relative L2 difference of the gradients";
    }
#endif
}

// Megatron's masks: positions restart after each EOD, the EOD ends its document, and each
// sample border is a document border.
TEST(PackedDocuments, MarksAsMegatron) {
  const std::vector<int32_t> tokens{4, 9, 4, 4, 9, 4, 4, 4, 9, 4};
  std::vector<int32_t> pos, cu;
  data::mark_documents(tokens, 2, 5, 9, true, true, pos, cu);
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 0, 1, 2, 0, 1, 2, 3, 0}));
  EXPECT_EQ(cu, (std::vector<int32_t>{0, 2, 5, 9, 10}));
  data::mark_documents(tokens, 2, 5, 9, false, true, pos, cu);
  EXPECT_TRUE(pos.empty());
  data::mark_documents(tokens, 2, 5, 9, true, false, pos, cu);
  EXPECT_TRUE(cu.empty());
}

}  // namespace
}  // namespace mt::model
