// Model FLOPs per iteration against hand computations of Megatron's formula.
#include <gtest/gtest.h>

#include "model/config.h"
#include "training/flops.h"

namespace mt {
namespace {

model::TransformerConfig small() {
  model::TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 64;
  c.ffn_hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.swiglu = true;
  c.normalization = "RMSNorm";
  c.position_embedding_type = "rope";
  c.vocab_size = 128;
  c.seq_length = 16;
  c.finalize();
  return c;
}

TEST(Flops, DenseModel) {
  // Per token: MLP 6*h*f*3*L = 6*64*256*3*4 = 1,179,648; attention projections
  // 6*(h*(n*d + 2*d*g) + n*d*h)*L = 6*(64*128 + 4096)*4 = 294,912; logits 6*h*V = 49,152.
  // 32 tokens: 48,758,784; attention scores S2*6*n*d*L = 512*6*64*4 = 786,432.
  EXPECT_DOUBLE_EQ(flops_per_iteration(small(), 2, 16), 48758784.0 + 786432.0);
}

TEST(Flops, MoELayersCountTopKExpertsAndTheSharedExpert) {
  model::TransformerConfig c = small();
  c.moe.num_experts = 8;
  c.moe.topk = 2;
  c.moe.moe_ffn_hidden_size = 32;
  c.moe.shared_expert_intermediate_size = 48;
  c.moe.layer_pattern = {true, false, true, false};
  c.finalize();
  // Per token: MLP 6*h*3*(f*2 dense layers + (moe_ffn*topk + shared)*2 MoE layers)
  //   = 1152*(512 + 224) = 847,872; attention 294,912; logits 49,152: 1,191,936.
  // 32 tokens: 38,141,952; attention scores 786,432.
  EXPECT_DOUBLE_EQ(flops_per_iteration(c, 2, 16), 38141952.0 + 786432.0);
  // The number of experts itself does not change the FLOPs (only top-k does).
  c.moe.num_experts = 64;
  EXPECT_DOUBLE_EQ(flops_per_iteration(c, 2, 16), 38141952.0 + 786432.0);
}

TEST(Flops, EveryLayerMoEWithoutSharedExpert) {
  model::TransformerConfig c = small();
  c.moe.num_experts = 4;
  c.moe.topk = 1;
  c.finalize();  // moe_ffn defaults to ffn: top-1 of ffn-sized experts costs what the dense MLP does
  EXPECT_EQ(c.moe.moe_ffn_hidden_size, 256);
  EXPECT_DOUBLE_EQ(flops_per_iteration(c, 2, 16), flops_per_iteration(small(), 2, 16));
}

}  // namespace
}  // namespace mt
