#include "checkpoint/model_args.h"

#include "core/error.h"

namespace mt::checkpoint {

namespace {

// The MoE settings under Megatron's argument names (but --moe-layer-freq, below): one list for
// writing and reading, so the two cannot drift apart.
template <typename Config, typename Visit>
void moe_fields(Config& m, Visit&& f) {
  f("moe_ffn_hidden_size", m.moe_ffn_hidden_size);
  f("moe_router_topk", m.topk);
  f("moe_router_score_function", m.score_function);
  f("moe_router_pre_softmax", m.pre_softmax);
  f("moe_router_topk_scaling_factor", m.topk_scaling_factor);
  f("moe_router_dtype", m.router_dtype);
  f("moe_router_num_groups", m.num_groups);
  f("moe_router_group_topk", m.group_topk);
  f("moe_router_load_balancing_type", m.load_balancing_type);
  f("moe_aux_loss_coeff", m.aux_loss_coeff);
  f("moe_z_loss_coeff", m.z_loss_coeff);
  f("moe_router_enable_expert_bias", m.enable_expert_bias);
  f("moe_router_bias_update_rate", m.bias_update_rate);
  f("moe_shared_expert_intermediate_size", m.shared_expert_intermediate_size);
  f("moe_shared_expert_gate", m.shared_expert_gate);
  f("moe_expert_capacity_factor", m.capacity_factor);
  f("moe_pad_expert_input_to_capacity", m.pad_to_capacity);
  f("moe_token_drop_policy", m.drop_policy);
  f("moe_token_dispatcher_type", m.token_dispatcher);
  f("moe_grouped_gemm", m.grouped_gemm);
  f("moe_permute_fusion", m.permute_fusion);
}

// --moe-layer-freq as Megatron keeps it: 1 (every layer) or the list of 0/1 per layer.
void moe_to_json(const model::MoEConfig& m, nlohmann::json& j) {
  j["num_experts"] = m.num_experts;
  nlohmann::json freq = 1;
  if (!m.layer_pattern.empty()) {
    freq = nlohmann::json::array();
    for (bool b : m.layer_pattern) freq.push_back(b ? 1 : 0);
  }
  j["moe_layer_freq"] = freq;
  moe_fields(m, [&](const char* key, const auto& field) { j[key] = field; });
}

// Absent (or null, as Megatron writes None) keys keep MoEConfig's defaults, which are Megatron's;
// parse_state has checked the values' types and ranges.
void moe_from_json(const nlohmann::json& j, int64_t num_layers, model::MoEConfig& m) {
  m = model::MoEConfig{};
  auto read = [&](const char* key, auto& field) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) field = it->get<std::remove_reference_t<decltype(field)>>();
  };
  read("num_experts", m.num_experts);
  if (m.num_experts == 0) return;
  moe_fields(m, read);
  if (auto it = j.find("moe_layer_freq"); it != j.end() && it->is_array()) {
    for (const auto& b : *it) m.layer_pattern.push_back(b.get<int64_t>() == 1);
  } else if (it != j.end() && it->is_number() && it->get<int64_t>() > 1) {
    const int64_t every = it->get<int64_t>();
    for (int64_t l = 0; l < num_layers; ++l) m.layer_pattern.push_back(l % every == 0);
  }
}

}  // namespace

nlohmann::json model_args_to_json(const model::TransformerConfig& m, const data::TokenizerOptions& tokenizer) {
  nlohmann::json j = {{"num_layers", m.num_layers},
          {"hidden_size", m.hidden_size},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"num_attention_heads", m.num_attention_heads},
          {"num_query_groups", m.num_query_groups},
          {"kv_channels", m.kv_channels},
          {"seq_length", m.seq_length},
          {"max_position_embeddings", m.max_position_embeddings},
          {"vocab_size", m.vocab_size},
          {"orig_vocab_size", m.orig_vocab_size},
          {"normalization", m.normalization},
          {"norm_epsilon", m.norm_epsilon},
          {"swiglu", m.swiglu},
          {"openai_gelu", m.openai_gelu},
          {"position_embedding_type", m.position_embedding_type},
          {"rotary_base", m.rotary_base},
          {"rotary_percent", m.rotary_percent},
          {"rope_scaling", m.rope_scaling},
          {"rope_scaling_factor", m.rope_scaling_factor},
          {"rope_low_freq_factor", m.rope_low_freq_factor},
          {"rope_high_freq_factor", m.rope_high_freq_factor},
          {"rope_original_max_position", m.rope_original_max_position},
          {"qk_layernorm", m.qk_layernorm},
          {"layernorm_zero_centered_gamma", m.layernorm_zero_centered_gamma},
          {"add_bias_linear", m.add_bias_linear},
          {"add_qkv_bias", m.add_qkv_bias},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
          {"bf16", m.bf16},
          {"fp16", m.fp16},
          {"tokenizer_type", tokenizer.type},
          {"vocab_file", tokenizer.vocab_file},
          {"merge_file", tokenizer.merge_file},
          {"tokenizer_model", tokenizer.tokenizer_model},
          {"tokenizer_vocab_size", tokenizer.vocab_size},
          {"tiktoken_pattern", tokenizer.tiktoken_pattern},
          {"tiktoken_num_special_tokens", tokenizer.tiktoken_num_special_tokens},
          {"tokenizer_special_tokens", tokenizer.special_tokens}};
  if (m.moe.enabled()) moe_to_json(m.moe, j);  // dense checkpoints stay as they were
  return j;
}

void model_args_from_json(const nlohmann::json& j, model::TransformerConfig& m, data::TokenizerOptions& tokenizer) {
  try {
    m.num_layers = j.at("num_layers");
    m.hidden_size = j.at("hidden_size");
    m.ffn_hidden_size = j.at("ffn_hidden_size");
    m.num_attention_heads = j.at("num_attention_heads");
    m.num_query_groups = j.at("num_query_groups");
    m.kv_channels = j.at("kv_channels");
    m.seq_length = j.at("seq_length");
    m.max_position_embeddings = j.at("max_position_embeddings");
    m.vocab_size = j.at("vocab_size");
    m.orig_vocab_size = j.at("orig_vocab_size");
    m.normalization = j.at("normalization");
    m.norm_epsilon = j.at("norm_epsilon");
    m.swiglu = j.at("swiglu");
    m.openai_gelu = j.at("openai_gelu");
    m.position_embedding_type = j.at("position_embedding_type");
    m.rotary_base = j.at("rotary_base");
    m.rotary_percent = j.at("rotary_percent");
    // Added later: older checkpoints lack them and had neither feature.
    m.rope_scaling = j.value("rope_scaling", false);
    m.rope_scaling_factor = j.value("rope_scaling_factor", 8.0);
    m.rope_low_freq_factor = j.value("rope_low_freq_factor", 1.0);
    m.rope_high_freq_factor = j.value("rope_high_freq_factor", 4.0);
    m.rope_original_max_position = j.value("rope_original_max_position", int64_t{8192});
    m.qk_layernorm = j.value("qk_layernorm", false);
    m.layernorm_zero_centered_gamma = j.value("layernorm_zero_centered_gamma", false);
    m.add_bias_linear = j.at("add_bias_linear");
    m.add_qkv_bias = j.at("add_qkv_bias");
    m.untie_embeddings_and_output_weights = j.at("untie_embeddings_and_output_weights");
    m.bf16 = j.at("bf16");
    m.fp16 = j.value("fp16", false);  // added later: older checkpoints are bf16 or fp32
    tokenizer.type = j.at("tokenizer_type");
    tokenizer.vocab_file = j.at("vocab_file");
    tokenizer.merge_file = j.at("merge_file");
    tokenizer.tokenizer_model = j.at("tokenizer_model");
    tokenizer.vocab_size = j.at("tokenizer_vocab_size");
    // Added with TikTokenizer: older checkpoints have Megatron's defaults.
    tokenizer.tiktoken_pattern = j.value("tiktoken_pattern", std::string());
    tokenizer.tiktoken_num_special_tokens = j.value("tiktoken_num_special_tokens", int64_t{1000});
    tokenizer.special_tokens = j.value("tokenizer_special_tokens", std::vector<std::string>());
    moe_from_json(j, m.num_layers, m.moe);  // added later: a checkpoint without it is dense
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint state.json lacks model arguments: {}", e.what());
  }
}

}  // namespace mt::checkpoint
