// Gradient buckets: backward order, whole parameters, padding to a multiple of DP for the
// distributed optimizer, and each DP rank's owned slice; MoE experts in buckets of their own,
// over the expert-data-parallel group. No processes needed: the DP group is
// a stand-in that only reports its size and rank.
#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "parallel/ddp.h"
#include "parallel/size_only_comm.h"

namespace mt::parallel {
namespace {

using mt::testing::SizeOnly;

model::TransformerConfig tiny() {
  model::TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.vocab_size = 35;  // odd sizes make the padding visible
  c.orig_vocab_size = 35;
  return c;
}

TEST(DataParallelBuckets, BackwardOrderPaddedOwnedSlices) {
  DDPOptions o;
  o.use_distributed_optimizer = true;
  o.bucket_size = 700;
  DataParallel dp(std::make_shared<SizeOnly>(1, 3), o);
  model::GPTModel m(tiny(), model::ModelOptions{nullptr, false, dp.layout_fn()});
  dp.attach(m.params());
  const auto& b = dp.buckets();
  ASSERT_GT(b.size(), 2u);
  auto& ps = m.params().params();
  EXPECT_EQ(b.front().params.front(), &ps.back());  // the first bucket reduced holds the last parameters
  EXPECT_EQ(b.back().params.back(), &ps.front());
  int64_t prev_end = m.params().numel();
  size_t count = 0;
  for (const auto& k : b) {
    EXPECT_EQ((k.end - k.begin) % 3, 0);
    EXPECT_EQ(k.end, prev_end);  // buckets tile the buffer from the end
    prev_end = k.begin;
    for (const auto* p : k.params) {
      EXPECT_GE(p->offset, k.begin);
      EXPECT_LE(p->offset + p->numel(), k.end);
      ++count;
    }
  }
  EXPECT_EQ(prev_end, 0);
  EXPECT_EQ(count, ps.size());
  for (size_t i = 1; i < ps.size(); ++i) EXPECT_LT(ps[i - 1].offset, ps[i].offset);  // registration order kept
  auto owned = dp.owned_ranges();
  ASSERT_EQ(owned.size(), b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    const auto& k = b[b.size() - 1 - i];  // owned ranges come sorted by offset
    const int64_t chunk = (k.end - k.begin) / 3;
    EXPECT_EQ(owned[i], (std::pair<int64_t, int64_t>{k.begin + chunk, k.begin + 2 * chunk}));
  }
}

TEST(DataParallelBuckets, OneUnpaddedBucketByDefault) {
  DataParallel dp(std::make_shared<SizeOnly>(0, 4), DDPOptions{});
  model::GPTModel m(tiny(), model::ModelOptions{nullptr, false, dp.layout_fn()});
  dp.attach(m.params());
  ASSERT_EQ(dp.buckets().size(), 1u);  // Megatron: no overlap, no bucketing
  EXPECT_EQ(dp.buckets()[0].end, m.config().num_parameters());
  DDPOptions ov;
  ov.overlap_grad_reduce = true;
  EXPECT_EQ(effective_bucket_size(ov, 64), 64000000);
  EXPECT_EQ(effective_bucket_size(ov, 8), 40000000);
}

// MoE experts (this rank's 2 of 4 per layer) get buckets of their own after the dense ones,
// padded to and sharded over expert DP (2 here) while dense buckets go over DP (3).
TEST(DataParallelBuckets, ExpertBucketsOverExpertDataParallel) {
  model::TransformerConfig c = tiny();
  c.moe.num_experts = 4;
  c.moe.moe_ffn_hidden_size = 12;
  DDPOptions o;
  o.use_distributed_optimizer = true;
  o.bucket_size = 700;
  DataParallel dp(std::make_shared<SizeOnly>(2, 3), o, std::make_shared<SizeOnly>(1, 2));
  SizeOnly ep(1, 2);
  model::ModelOptions mo{nullptr, false, dp.layout_fn()};
  mo.expert.ep = &ep;
  model::GPTModel m(c, mo);
  dp.attach(m.params());
  EXPECT_TRUE(dp.has_expert_buckets() && dp.experts_sharded() && dp.sharded());
  int64_t dense_end = 0, expert_begin = m.params().numel(), experts = 0;
  for (const auto& k : dp.buckets()) {
    EXPECT_EQ((k.end - k.begin) % (k.expert ? 2 : 3), 0);
    EXPECT_EQ(k.group->size(), k.expert ? 2 : 3);
    for (const auto* p : k.params) EXPECT_EQ(p->expert, k.expert) << p->name;
    if (k.expert) expert_begin = std::min(expert_begin, k.begin);
    else dense_end = std::max(dense_end, k.end);
    for (const auto* p : k.params) experts += p->expert && p->name.find("linear_fc1.weight") != std::string::npos;
  }
  EXPECT_LE(dense_end, expert_begin);  // dense first, then the experts
  EXPECT_EQ(experts, 2 * 2);           // experts 2 and 3 of both layers
  EXPECT_NE(m.params().find("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight"), nullptr);
  EXPECT_EQ(m.params().find("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"), nullptr);
  for (const auto& k : dp.buckets()) {  // each bucket's owned slice: this rank's share of its group
    const int64_t n = k.group->size(), chunk = (k.end - k.begin) / n, r = k.group->rank();
    const std::pair<int64_t, int64_t> mine{k.begin + chunk * r, k.begin + chunk * (r + 1)};
    auto owned = dp.owned_ranges();
    EXPECT_NE(std::find(owned.begin(), owned.end(), mine), owned.end());
  }
}

}  // namespace
}  // namespace mt::parallel
