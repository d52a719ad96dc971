#include "checkpoint/model_args.h"

#include "core/error.h"

namespace mt::checkpoint {

nlohmann::json model_args_to_json(const model::TransformerConfig& m, const data::TokenizerOptions& tokenizer) {
  return {{"num_layers", m.num_layers},
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
          {"add_bias_linear", m.add_bias_linear},
          {"add_qkv_bias", m.add_qkv_bias},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights},
          {"bf16", m.bf16},
          {"fp16", m.fp16},
          {"tokenizer_type", tokenizer.type},
          {"vocab_file", tokenizer.vocab_file},
          {"merge_file", tokenizer.merge_file},
          {"tokenizer_model", tokenizer.tokenizer_model},
          {"tokenizer_vocab_size", tokenizer.vocab_size}};
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
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint state.json lacks model arguments: {}", e.what());
  }
}

}  // namespace mt::checkpoint
