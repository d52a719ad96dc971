// HuggingFace mixture-of-experts configs and weight names against the fixtures transformers 5.17
// made (fixtures/make_fixtures.py): Mixtral (top-2 renormalised, bf16), Qwen2-MoE (gated shared
// expert, QKV bias, layer 1 dense via mlp_only_layers, unnormalised top-2) and Qwen3-MoE (q/k
// norm, num_local_experts as transformers 5 writes it). Every fixture tensor maps to a native
// name and back to the same values; configs survive the way out in both transformers styles;
// what an architecture cannot hold is refused by name.
#include <gtest/gtest.h>

#include <set>

#include "checkpoint/hf_config.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/hf_weights.h"
#include "checkpoint/io_util.h"
#include "core/error.h"
#include "support/error_of.h"

namespace mt {
namespace {

using nlohmann::json;
using test::error_of;
const std::string kFixtures = std::string(MT_SOURCE_DIR) + "/tests/checkpoint/fixtures/";

TEST(HfMoEConfig, FixturesReadAsMegatronsSettings) {
  const auto mixtral = checkpoint::read_hf_config(kFixtures + "mixtral");
  EXPECT_EQ(mixtral.arch, "mixtral");
  const auto& x = mixtral.cfg.moe;
  EXPECT_EQ(x.num_experts, 4);
  EXPECT_EQ(x.topk, 2);
  EXPECT_EQ(x.moe_ffn_hidden_size, 64);  // Mixtral's intermediate_size
  EXPECT_FALSE(x.pre_softmax);           // renormalised top-k = softmax over the top-k logits
  EXPECT_EQ(x.score_function, "softmax");
  EXPECT_TRUE(x.layer_pattern.empty());
  EXPECT_EQ(x.shared_expert_intermediate_size, 0);
  EXPECT_EQ(x.aux_loss_coeff, 0.01);
  EXPECT_FALSE(mixtral.cfg.add_qkv_bias);
  EXPECT_FALSE(mixtral.cfg.qk_layernorm);

  const auto qwen2 = checkpoint::read_hf_config(kFixtures + "qwen2_moe");
  const auto& q2 = qwen2.cfg.moe;
  EXPECT_EQ(q2.num_experts, 4);
  EXPECT_EQ(q2.moe_ffn_hidden_size, 16);
  EXPECT_EQ(qwen2.cfg.ffn_hidden_size, 64);  // the dense layer's
  EXPECT_TRUE(q2.pre_softmax);               // norm_topk_prob false
  EXPECT_EQ(q2.shared_expert_intermediate_size, 48);
  EXPECT_TRUE(q2.shared_expert_gate);
  EXPECT_EQ(q2.layer_pattern, (std::vector<bool>{true, false}));  // mlp_only_layers [1]
  EXPECT_TRUE(qwen2.cfg.add_qkv_bias);

  const auto qwen3 = checkpoint::read_hf_config(kFixtures + "qwen3_moe");
  const auto& q3 = qwen3.cfg.moe;
  EXPECT_EQ(q3.num_experts, 4);  // num_local_experts
  EXPECT_EQ(q3.moe_ffn_hidden_size, 16);
  EXPECT_FALSE(q3.pre_softmax);  // norm_topk_prob true
  EXPECT_TRUE(q3.layer_pattern.empty());
  EXPECT_TRUE(qwen3.cfg.qk_layernorm);
  for (const auto* s : {&mixtral, &qwen2, &qwen3}) {
    model::TransformerConfig c = s->cfg;
    EXPECT_NO_THROW(c.finalize()) << s->arch;
    EXPECT_EQ(checkpoint::infer_hf_arch(c), s->arch);
  }
}

TEST(HfMoEConfig, QwenLayerRuleIsTransformers) {
  // Layer L is MoE unless in mlp_only_layers, when (L + 1) % decoder_sparse_step == 0.
  json j = checkpoint::read_hf_config(kFixtures + "qwen3_moe").raw;
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  EXPECT_EQ(checkpoint::parse_hf_config(j, "c").cfg.moe.layer_pattern,
            (std::vector<bool>{false, true, false, false, false, true}));
  j["mlp_only_layers"] = nullptr;
  j["decoder_sparse_step"] = 1;
  EXPECT_TRUE(checkpoint::parse_hf_config(j, "c").cfg.moe.layer_pattern.empty());
  j["mlp_only_layers"] = {6};
  EXPECT_NE(error_of([&] { checkpoint::parse_hf_config(j, "X/config.json"); })
                .find("X/config.json: mlp_only_layers[0] must be an integer between 0 and 5"),
            std::string::npos);
  j["mlp_only_layers"] = json::array();
  j["decoder_sparse_step"] = 0;
  EXPECT_NE(error_of([&] { checkpoint::parse_hf_config(j, "X/config.json"); }).find("decoder_sparse_step"),
            std::string::npos);
  j["decoder_sparse_step"] = 1;
  j.erase("num_experts_per_tok");  // transformers' default (8) is more than the 4 experts (fuzz finding)
  EXPECT_EQ(error_of([&] { checkpoint::parse_hf_config(j, "X/config.json"); }),
            "X/config.json: num_experts_per_tok is missing, and transformers' default for qwen3_moe (8) exceeds the 4 "
            "experts; set it");
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(error_of([&] { checkpoint::parse_hf_config(j, "X/config.json"); })
                .find("num_experts_per_tok must be an integer between 1 and 4"),
            std::string::npos);
}

// The way out: parse(make(spec)) is spec again, in both transformers styles; the config's own
// decoder_sparse_step / mlp_only_layers are kept where they still describe the layers.
TEST(HfMoEConfig, WrittenConfigsReadBackTheSame) {
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    const auto s = checkpoint::read_hf_config(kFixtures + arch);
    for (bool v5 : {false, true}) {
      const json j = checkpoint::make_hf_config(s, v5);
      const auto b = checkpoint::parse_hf_config(j, "written");
      const auto &x = s.cfg.moe, &y = b.cfg.moe;
      EXPECT_EQ(b.arch, s.arch);
      EXPECT_EQ(y.num_experts, x.num_experts) << arch;
      EXPECT_EQ(y.topk, x.topk) << arch;
      EXPECT_EQ(y.moe_ffn_hidden_size, x.moe_ffn_hidden_size) << arch;
      EXPECT_EQ(y.pre_softmax, x.pre_softmax) << arch;
      EXPECT_EQ(y.shared_expert_intermediate_size, x.shared_expert_intermediate_size) << arch;
      EXPECT_EQ(y.shared_expert_gate, x.shared_expert_gate) << arch;
      EXPECT_EQ(y.layer_pattern, x.layer_pattern) << arch;
      EXPECT_EQ(y.aux_loss_coeff, x.aux_loss_coeff) << arch;
      EXPECT_EQ(b.cfg.ffn_hidden_size, s.cfg.ffn_hidden_size) << arch;
      EXPECT_EQ(b.cfg.add_qkv_bias, s.cfg.add_qkv_bias) << arch;
      EXPECT_EQ(b.cfg.qk_layernorm, s.cfg.qk_layernorm) << arch;
    }
    // The keys transformers reads, as the fixture has them.
    const json j = checkpoint::make_hf_config(s, true);
    for (const auto& [k, v] : s.raw.items()) {
      if (k.find("expert") != std::string::npos || k == "decoder_sparse_step" || k == "mlp_only_layers" ||
          k == "norm_topk_prob" || k == "moe_intermediate_size" || k == "intermediate_size") {
        EXPECT_EQ(j.at(k), v) << arch << ": " << k;
      }
    }
  }
  // A pattern the recorded config no longer describes is written as step 1 + the dense layers.
  auto s = checkpoint::read_hf_config(kFixtures + "qwen3_moe");
  s.cfg.moe.layer_pattern = {false, true};
  const json j = checkpoint::make_hf_config(s, true);
  EXPECT_EQ(j["decoder_sparse_step"], 1);
  EXPECT_EQ(j["mlp_only_layers"], json::array({0}));
  EXPECT_EQ(checkpoint::parse_hf_config(j, "w").cfg.moe.layer_pattern, (std::vector<bool>{false, true}));
}

TEST(HfMoEConfig, WhatAnArchitectureCannotHoldIsRefused) {
  auto err = [](checkpoint::HfSpec s) { return error_of([&] { checkpoint::make_hf_config(s, true); }); };
  const auto mixtral = checkpoint::read_hf_config(kFixtures + "mixtral");
  auto s = mixtral;
  s.cfg.moe.layer_pattern = {true, false};
  EXPECT_EQ(err(s), "--to hf: the model has dense layers (--moe-layer-freq), which a HuggingFace mixtral model cannot hold");
  s = mixtral;
  s.cfg.moe.pre_softmax = true;
  EXPECT_NE(err(s).find("unnormalised top-k weights (--moe-router-pre-softmax)"), std::string::npos);
  s = mixtral;
  s.cfg.moe.score_function = "sigmoid";
  EXPECT_NE(err(s).find("sigmoid router scores"), std::string::npos);
  s = mixtral;
  s.cfg.moe.capacity_factor = 1.0;
  EXPECT_NE(err(s).find("token dropping"), std::string::npos);
  s = mixtral;
  s.arch = "llama";
  EXPECT_NE(err(s).find("the model has experts (--num-experts 4); a HuggingFace llama model cannot hold them"),
            std::string::npos);
  s = mixtral;
  s.arch = "qwen2_moe";
  EXPECT_NE(err(s).find("has no gated shared expert"), std::string::npos);
  s = mixtral;
  s.arch = "qwen3_moe";
  EXPECT_NE(err(s).find("has no q/k norms (--qk-layernorm), which a HuggingFace qwen3_moe model always has"),
            std::string::npos);
  s = checkpoint::read_hf_config(kFixtures + "llama2");
  s.arch = "mixtral";
  EXPECT_NE(err(s).find("model_type mixtral needs experts, but the checkpoint is a dense model"), std::string::npos);
}

// Every tensor of each fixture is named by exactly one rule, and HF -> native -> HF gives back
// its values (the expert layouts: [gate; up] per expert, the shared expert and its gate).
TEST(HfMoEWeights, EveryFixtureTensorMapsToANativeNameAndBack) {
  for (const char* arch : {"mixtral", "qwen2_moe", "qwen3_moe"}) {
    const auto spec = checkpoint::read_hf_config(kFixtures + arch);
    checkpoint::SafetensorsFile file(kFixtures + arch + "/model.safetensors");
    checkpoint::HfTensors src(kFixtures + arch);
    std::set<std::string> named;
    std::set<std::string> native;
    for (const auto& r : checkpoint::hf_rules(spec)) {
      EXPECT_TRUE(native.insert(r.megatron).second) << r.megatron;
      Shape shape = file.entry(r.hf[0]).shape;
      if (r.kind == checkpoint::HfRule::Fc1) shape[0] *= 2;
      if (r.kind == checkpoint::HfRule::Qkv) shape[0] = file.entry(r.hf[0]).shape[0] + 2 * file.entry(r.hf[1]).shape[0];
      const std::vector<float> m = checkpoint::import_tensor(spec, r, src, shape);
      for (const auto& t : checkpoint::export_tensor(spec, r, m, shape)) {
        EXPECT_TRUE(named.insert(t.name).second) << t.name;
        EXPECT_EQ(t.shape, file.entry(t.name).shape) << t.name;
        std::vector<float> want(t.values.size());
        file.read_f32(t.name, t.shape, want.data());
        EXPECT_EQ(t.values, want) << arch << ": " << t.name;
      }
    }
    EXPECT_EQ(named.size(), file.names().size()) << arch;
    EXPECT_TRUE(src.unused().empty()) << arch << ": " << src.unused().front();
    // Megatron Core's SequentialMLP names.
    EXPECT_TRUE(native.count("decoder.layers.0.mlp.router.weight")) << arch;
    EXPECT_TRUE(native.count("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight")) << arch;
    EXPECT_TRUE(native.count("decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight")) << arch;
  }
  const auto q2 = checkpoint::hf_rules(checkpoint::read_hf_config(kFixtures + "qwen2_moe"));
  auto find = [&](const std::string& n) {
    for (const auto& r : q2)
      if (r.megatron == n) return r.hf;
    return std::vector<std::string>{};
  };
  EXPECT_EQ(find("decoder.layers.0.mlp.shared_experts.gate_weight"),
            std::vector<std::string>{"model.layers.0.mlp.shared_expert_gate.weight"});
  EXPECT_EQ(find("decoder.layers.0.mlp.shared_experts.linear_fc1.weight"),
            (std::vector<std::string>{"model.layers.0.mlp.shared_expert.gate_proj.weight",
                                      "model.layers.0.mlp.shared_expert.up_proj.weight"}));
  EXPECT_EQ(find("decoder.layers.1.mlp.linear_fc1.weight"),  // the dense layer
            (std::vector<std::string>{"model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight"}));
  const auto mx = checkpoint::hf_rules(checkpoint::read_hf_config(kFixtures + "mixtral"));
  bool found = false;
  for (const auto& r : mx)
    if (r.megatron == "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight") {
      found = true;
      EXPECT_EQ(r.hf, (std::vector<std::string>{"model.layers.1.block_sparse_moe.experts.2.w1.weight",
                                                "model.layers.1.block_sparse_moe.experts.2.w3.weight"}));
    }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace mt
