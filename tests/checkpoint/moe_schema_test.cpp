// The MoE fields of a native checkpoint's model arguments (state.json "args"): written under
// Megatron's argument names for MoE models only, read back to the same MoEConfig, checked before
// use; a checkpoint without them is dense, as every checkpoint before MoE was.
#include <gtest/gtest.h>

#include "checkpoint/metadata.h"
#include "checkpoint/model_args.h"
#include "core/error.h"
#include "support/error_of.h"

namespace mt {
namespace {

using nlohmann::json;

model::TransformerConfig moe_model() {
  model::TransformerConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.swiglu = true;
  c.vocab_size = 64;
  c.orig_vocab_size = 50;
  auto& m = c.moe;
  m.num_experts = 8;
  m.moe_ffn_hidden_size = 24;
  m.layer_pattern = {true, false, true, true};
  m.topk = 4;
  m.score_function = "sigmoid";
  m.topk_scaling_factor = 2.5;
  m.num_groups = 4;
  m.group_topk = 2;
  m.load_balancing_type = "seq_aux_loss";
  m.aux_loss_coeff = 0.01;
  m.z_loss_coeff = 0.001;
  m.enable_expert_bias = true;
  m.bias_update_rate = 0.002;
  m.shared_expert_intermediate_size = 40;
  m.shared_expert_gate = true;
  m.capacity_factor = 1.25;
  m.pad_to_capacity = true;
  m.drop_policy = "position";
  m.token_dispatcher = "alltoall";
  m.grouped_gemm = m.permute_fusion = true;
  c.finalize();
  return c;
}

// A state.json around `args`, as parse_state reads it.
json state_with(const json& args) {
  json s = json::parse(R"({"iteration": 1, "consumed_train_samples": 2, "consumed_valid_samples": 0,
    "optimizer_steps": 1, "has_rng": false, "rng_seed": 1, "rng_offset": 0})");
  s["args"] = args;
  return s;
}

model::TransformerConfig read_back(const json& args) {
  const checkpoint::TrainingState st = checkpoint::parse_state(state_with(args), "/c/state.json", 1);
  model::TransformerConfig c;
  data::TokenizerOptions t;
  checkpoint::model_args_from_json(st.args, c, t);
  return c;
}

std::string read_error(const json& args) {
  return test::error_of([&] { read_back(args); });
}

TEST(MoESchema, EveryFieldRoundTrips) {
  const model::TransformerConfig c = moe_model();
  const json j = checkpoint::model_args_to_json(c, {});
  EXPECT_EQ(j["num_experts"], 8);
  EXPECT_EQ(j["moe_layer_freq"], json::array({1, 0, 1, 1}));
  EXPECT_EQ(j["moe_router_topk"], 4);  // Megatron's names
  model::TransformerConfig b = read_back(j);
  b.finalize();
  const auto &x = c.moe, &y = b.moe;
  EXPECT_EQ(y.num_experts, x.num_experts);
  EXPECT_EQ(y.moe_ffn_hidden_size, x.moe_ffn_hidden_size);
  EXPECT_EQ(y.layer_pattern, x.layer_pattern);
  EXPECT_EQ(y.topk, x.topk);
  EXPECT_EQ(y.score_function, x.score_function);
  EXPECT_EQ(y.pre_softmax, x.pre_softmax);
  EXPECT_EQ(y.topk_scaling_factor, x.topk_scaling_factor);
  EXPECT_EQ(y.router_dtype, x.router_dtype);
  EXPECT_EQ(y.num_groups, x.num_groups);
  EXPECT_EQ(y.group_topk, x.group_topk);
  EXPECT_EQ(y.load_balancing_type, x.load_balancing_type);
  EXPECT_EQ(y.aux_loss_coeff, x.aux_loss_coeff);
  EXPECT_EQ(y.z_loss_coeff, x.z_loss_coeff);
  EXPECT_EQ(y.enable_expert_bias, x.enable_expert_bias);
  EXPECT_EQ(y.bias_update_rate, x.bias_update_rate);
  EXPECT_EQ(y.shared_expert_intermediate_size, x.shared_expert_intermediate_size);
  EXPECT_EQ(y.shared_expert_gate, x.shared_expert_gate);
  EXPECT_EQ(y.capacity_factor, x.capacity_factor);
  EXPECT_EQ(y.pad_to_capacity, x.pad_to_capacity);
  EXPECT_EQ(y.drop_policy, x.drop_policy);
  EXPECT_EQ(y.token_dispatcher, x.token_dispatcher);
  EXPECT_EQ(y.grouped_gemm, x.grouped_gemm);
  EXPECT_EQ(y.permute_fusion, x.permute_fusion);
  EXPECT_EQ(b.num_parameters(), c.num_parameters());
}

TEST(MoESchema, DenseCheckpointsHaveNoMoEKeysAndReadAsDense) {
  model::TransformerConfig c = moe_model();
  c.moe = model::MoEConfig{};
  const json j = checkpoint::model_args_to_json(c, {});
  for (const auto& [k, v] : j.items()) EXPECT_EQ(k.find("moe"), std::string::npos) << k;
  EXPECT_FALSE(j.contains("num_experts"));
  EXPECT_FALSE(read_back(j).moe.enabled());
  // Megatron writes None for a dense model.
  json n = j;
  n["num_experts"] = nullptr;
  n["moe_router_topk"] = 2;
  EXPECT_FALSE(read_back(n).moe.enabled());
}

TEST(MoESchema, MegatronsIntegerLayerFreqAndNullsAreRead) {
  json j = checkpoint::model_args_to_json(moe_model(), {});
  j["moe_layer_freq"] = 2;
  j["moe_router_topk_scaling_factor"] = nullptr;  // None: the default
  const model::TransformerConfig c = read_back(j);
  EXPECT_EQ(c.moe.layer_pattern, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c.moe.topk_scaling_factor, 0);
  j["moe_layer_freq"] = 1;
  EXPECT_TRUE(read_back(j).moe.layer_pattern.empty());
}

TEST(MoESchema, ValuesAreTypedAndRangedBeforeUse) {
  const json good = checkpoint::model_args_to_json(moe_model(), {});
  auto with = [&](const char* key, const json& v) {
    json j = good;
    j[key] = v;
    return read_error(j);
  };
  EXPECT_EQ(with("num_experts", 1000000),
            "'/c/state.json': args: num_experts must be an integer between 0 and 65536, got 1000000");
  EXPECT_EQ(with("moe_router_topk", 9),
            "'/c/state.json': args: moe_router_topk must be an integer between 1 and 8, got 9");
  EXPECT_NE(with("moe_ffn_hidden_size", -1).find("args: moe_ffn_hidden_size must be an integer between 0 and"),
            std::string::npos);
  EXPECT_NE(with("moe_layer_freq", json::array({1, 0, 1})).find("args: moe_layer_freq must hold 4 integers"),
            std::string::npos);
  EXPECT_NE(with("moe_layer_freq", json::array({1, 0, 2, 1}))
                .find("args: moe_layer_freq[2] must be an integer between 0 and 1"),
            std::string::npos);
  EXPECT_NE(with("moe_layer_freq", 0).find("args: moe_layer_freq must be an integer between 1 and 4"),
            std::string::npos);
  EXPECT_NE(with("moe_aux_loss_coeff", -1).find("args: moe_aux_loss_coeff must be a number between 0"),
            std::string::npos);
  EXPECT_NE(with("moe_shared_expert_gate", "yes").find("args: moe_shared_expert_gate must be true or false"),
            std::string::npos);
  EXPECT_NE(with("moe_router_score_function", 3).find("args: moe_router_score_function must be a string"),
            std::string::npos);
  // Rules between the fields: finalize() when the model is built, naming the flag to fix.
  json j = good;
  j["moe_router_score_function"] = "softmax";
  model::TransformerConfig c = read_back(j);
  try {
    c.finalize();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-router-enable-expert-bias needs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt
