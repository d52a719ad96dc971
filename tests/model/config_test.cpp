// TransformerConfig::finalize checks sizes from any source (flags, a checkpoint's state.json, an
// HF config.json) before a default is derived from them or anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "support/error_of.h"
#include "model/config.h"
#include "model/gpt_model.h"

namespace mt::model {
namespace {

// finalize()'s message for `c` ("" when it is accepted).
std::string error_of(TransformerConfig c) {
  return test::error_of([&] { c.finalize(); });
}

std::string finalize_error(const std::function<void(TransformerConfig&)>& edit) {
  TransformerConfig c;
  c.vocab_size = 128;
  edit(c);
  return error_of(c);
}

TEST(ConfigLimits, DefaultsStillWork) {
  EXPECT_EQ(finalize_error([](TransformerConfig&) {}), "");
  TransformerConfig c;
  c.vocab_size = 128;
  c.finalize();
  EXPECT_GT(c.num_parameters(), 0);
}

TEST(ConfigLimits, SizesOutOfRangeNameTheFlag) {
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.num_layers = 1000000000; }),
            "--num-layers: value out of range (got 1000000000; expected 1 to 65536)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.ffn_hidden_size = -1; }),
            "--ffn-hidden-size: value out of range (got -1; expected 1 to 4194304)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.hidden_size = int64_t{1} << 62; }),
            "--hidden-size: value out of range (got 4611686018427387904; expected 1 to 1048576)");
  EXPECT_EQ(finalize_error([](TransformerConfig& c) { c.num_query_groups = 8; }),
            "--num-query-groups: value out of range (got 8; expected 1 to 4)");
  EXPECT_NE(finalize_error([](TransformerConfig& c) { c.vocab_size = int64_t{1} << 40; }).find("vocabulary size"),
            std::string::npos);
}

TEST(ConfigLimits, NonFiniteFloatsAreRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.attention_dropout = nan; }).find("--attention-dropout"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.hidden_dropout = nan; }).find("--hidden-dropout"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.init_method_std = nan; }).find("--init-method-std"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.norm_epsilon = INFINITY; }).find("--norm-epsilon"),
            std::string::npos);
  EXPECT_NE(finalize_error([&](TransformerConfig& c) { c.rotary_percent = nan; }).find("--rotary-percent"),
            std::string::npos);
}

TEST(ConfigLimits, ParameterCountOverflowIsAnError) {
  const std::string e = finalize_error([](TransformerConfig& c) {
    c.num_layers = 65536;
    c.hidden_size = 1 << 20;
    c.num_attention_heads = 1 << 14;
    c.kv_channels = 1 << 15;
  });
  EXPECT_NE(e.find("parameter count of --num-layers 65536"), std::string::npos) << e;
  EXPECT_NE(e.find("is too large"), std::string::npos) << e;
}

TEST(ConfigLimits, PaddedVocabularyIsChecked) {
  EXPECT_EQ(padded_vocab_size(65, 128, 1), 128);
  EXPECT_EQ(padded_vocab_size(128, 128, 2), 256);
  EXPECT_THROW(padded_vocab_size(65, int64_t{1} << 62, 4), Error);
  EXPECT_THROW(padded_vocab_size(65, 0, 1), Error);
}


// A tiny MoE model to count by hand: h 8, 2 layers (layer 0 MoE, layer 1 dense), 2 heads of 4
// in 2 groups, SwiGLU ffn 16, no biases, RMSNorm, RoPE, untied vocabulary 32; 4 sigmoid-routed
// experts of 6 with an expert bias, top-2, a gated shared expert of 10.
TransformerConfig tiny_moe() {
  TransformerConfig c;
  c.num_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.ffn_hidden_size = 16;
  c.swiglu = true;
  c.add_bias_linear = c.add_qkv_bias = false;
  c.normalization = "RMSNorm";
  c.position_embedding_type = "rope";
  c.untie_embeddings_and_output_weights = true;
  c.vocab_size = 32;
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.moe_ffn_hidden_size = 6;
  c.moe.shared_expert_intermediate_size = 10;
  c.moe.shared_expert_gate = true;
  c.moe.score_function = "sigmoid";
  c.moe.enable_expert_bias = true;
  c.moe.layer_pattern = {true, false};
  return c;
}

TEST(ConfigMoE, ParametersCountedByHand) {
  TransformerConfig c = tiny_moe();
  c.finalize();
  // Attention: qkv 2*(1+2)*4 = 24 rows x 8 = 192, proj 8*8 = 64; two norms 16: 272 per layer.
  // Dense MLP: fc1 32x8 + fc2 8x16 = 384. One expert: fc1 12x8 + fc2 8x6 = 144. Router 4x8 = 32,
  // expert bias 4, shared expert 20x8 + 8x10 = 240, its gate 8.
  // Layer 0 (MoE): 272 + 32 + 4 + 4*144 + 240 + 8 = 1132; layer 1 (dense): 272 + 384 = 656.
  // Embedding 256, output layer 256, final norm 8.
  EXPECT_EQ(c.num_parameters(), 1132 + 656 + 520);
  // Active: the top-2 experts of layer 0 only.
  EXPECT_EQ(c.num_active_parameters(), 1132 - 2 * 144 + 656 + 520);
  // A dense model: both counts agree.
  TransformerConfig d = tiny_moe();
  d.moe = MoEConfig{};
  d.finalize();
  EXPECT_EQ(d.num_parameters(), 2 * 656 + 520);
  EXPECT_EQ(d.num_active_parameters(), d.num_parameters());
}

TEST(ConfigMoE, CountMatchesTheParametersTheModelRegisters) {
  for (bool biases : {false, true}) {
    TransformerConfig c = tiny_moe();
    c.add_bias_linear = c.add_qkv_bias = biases;  // expert and shared-expert biases counted too
    c.finalize();
    GPTModel m(c);
    EXPECT_EQ(m.params().numel(), c.num_parameters()) << biases;
  }
}

TEST(ConfigMoE, DefaultsAndEveryLayerPattern) {
  TransformerConfig c = tiny_moe();
  c.moe.moe_ffn_hidden_size = 0;
  c.moe.layer_pattern.clear();
  c.finalize();
  EXPECT_EQ(c.moe.moe_ffn_hidden_size, 16);  // --moe-ffn-hidden-size defaults to --ffn-hidden-size
  EXPECT_TRUE(c.moe.is_moe_layer(0));
  EXPECT_TRUE(c.moe.is_moe_layer(1));
  EXPECT_EQ(c.moe.num_moe_layers(2), 2);
}

std::string moe_error(const std::function<void(MoEConfig&)>& edit) {
  TransformerConfig c = tiny_moe();
  edit(c.moe);
  return error_of(c);
}

TEST(ConfigMoE, MegatronsRulesNameTheFlag) {
  EXPECT_EQ(moe_error([](MoEConfig&) {}), "");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.num_experts = int64_t{1} << 20; }),
            "--num-experts: value out of range (got 1048576; expected 1 to 65536)");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.topk = 5; }),
            "--moe-router-topk: value out of range (got 5; expected 1 to 4)");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.topk = 0; }),
            "--moe-router-topk: value out of range (got 0; expected 1 to 4)");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.layer_pattern = {true, false, true}; }),
            "--moe-layer-freq: the pattern has 3 entries but the model has 2 layers (--num-layers)");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.router_dtype = "fp64"; }),
            "--moe-router-dtype fp64: routing always runs in fp32 in megatron.cpp; use fp32");
  EXPECT_NE(moe_error([](MoEConfig& m) { m.score_function = "sqrtsoftplus"; }).find("--moe-router-score-function"),
            std::string::npos);
  EXPECT_NE(moe_error([](MoEConfig& m) { m.load_balancing_type = "global_aux_loss"; })
                .find("--moe-router-load-balancing-type got 'global_aux_loss'"),
            std::string::npos);
  EXPECT_NE(moe_error([](MoEConfig& m) { m.token_dispatcher = "flex"; }).find("--moe-token-dispatcher-type"),
            std::string::npos);
  EXPECT_NE(moe_error([](MoEConfig& m) { m.aux_loss_coeff = NAN; }).find("--moe-aux-loss-coeff"), std::string::npos);
  EXPECT_NE(moe_error([](MoEConfig& m) { m.z_loss_coeff = -1; }).find("--moe-z-loss-coeff"), std::string::npos);
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.enable_expert_bias = true, m.score_function = "softmax"; }),
            "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (aux-loss-free balancing as "
            "DeepSeek-V3)");
  EXPECT_NE(moe_error([](MoEConfig& m) { m.load_balancing_type = "sinkhorn", m.aux_loss_coeff = 0.01; })
                .find("sinkhorn does not use an aux loss"),
            std::string::npos);
  EXPECT_NE(moe_error([](MoEConfig& m) { m.load_balancing_type = "sinkhorn", m.capacity_factor = 1.0; })
                .find("--moe-expert-capacity-factor works only with"),
            std::string::npos);
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.pad_to_capacity = true; }),
            "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.shared_expert_intermediate_size = 0; }),
            "--moe-shared-expert-gate needs a shared expert (--moe-shared-expert-intermediate-size)");
  EXPECT_EQ(moe_error([](MoEConfig& m) { m.layer_pattern = {true, true}; }), "");  // all: kept as every layer
  EXPECT_NE(moe_error([](MoEConfig& m) { m.moe_ffn_hidden_size = -3; })
                .find("--moe-ffn-hidden-size: value out of range"),
            std::string::npos);
}

TEST(ConfigMoE, GroupLimitedRouting) {
  auto groups = [](int64_t experts, int64_t topk, int64_t n, int64_t k) {
    return moe_error([=](MoEConfig& m) {
      m.num_experts = experts, m.topk = topk, m.num_groups = n, m.group_topk = k;
    });
  };
  EXPECT_EQ(groups(8, 4, 4, 2), "");
  EXPECT_EQ(groups(8, 2, 3, 1), "--num-experts (8) must be divisible by --moe-router-num-groups (3)");
  EXPECT_EQ(groups(8, 2, 2, 3), "--moe-router-group-topk (3) must be at most --moe-router-num-groups (2)");
  EXPECT_NE(groups(8, 3, 4, 2).find("--moe-router-topk (3) must be divisible by --moe-router-group-topk (2)"),
            std::string::npos);
  EXPECT_NE(groups(8, 6, 4, 2).find("takes 3 experts per group"), std::string::npos);
  EXPECT_NE(groups(8, 2, 4, 0).find("go together"), std::string::npos);
  EXPECT_NE(groups(8, 2, 0, 1).find("go together"), std::string::npos);
}

TEST(ConfigMoE, DenseModelIgnoresMoEFields) {
  // A checkpoint or HF config without experts: the other MoE fields are never looked at.
  TransformerConfig c = tiny_moe();
  c.moe.num_experts = 0;
  c.moe.topk = 99;
  EXPECT_NO_THROW(c.finalize());
  EXPECT_EQ(c.moe.num_moe_layers(2), 0);
}

}  // namespace
}  // namespace mt::model
