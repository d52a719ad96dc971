#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "training/convert.h"

namespace mt {

namespace {

struct Setter {
  Arguments& a;
  const std::string& where;
  bool given(const char* flag) const { return std::find(a.given.begin(), a.given.end(), flag) != a.given.end(); }
  template <typename T>
  void value(const char* flag, T& field, T hf, const char* key) {
    const bool differ = [&] {
      if constexpr (std::is_floating_point_v<T>) return std::fabs(static_cast<double>(field - hf)) > 1e-12 * std::fabs(static_cast<double>(hf));
      else return field != hf;
    }();
    if (given(flag) && differ)
      fail("{} {} conflicts with {} ({} = {}); drop the flag, the model's shape comes from its config", flag,
           fmt::to_string(field), where, key, fmt::to_string(hf));
    field = hf;
  }
  // A store_true flag: given means true.
  void flag(const char* name, bool& field, bool hf, const char* key) {
    if (given(name) && !hf) fail("{} conflicts with {} ({} says otherwise); drop the flag", name, where, key);
    field = hf;
  }
};

// The experts and their routing come from the config; the training choices around them (load
// balancing, capacity, dispatcher, ...) stay the flags'.
void apply_hf_moe(Setter& set, Arguments& a, const model::MoEConfig& hf) {
  auto& m = a.model.moe;
  if (!hf.enabled()) {
    // A dense model gets experts only by upcycling (its MLPs copied into them).
    if (set.given("--num-experts") && !a.moe_use_upcycling)
      fail("--num-experts conflicts with {} (a dense model); drop the flag, or add --moe-use-upcycling to turn its "
           "MLPs into experts",
           set.where);
    return;
  }
  set.value("--num-experts", m.num_experts, hf.num_experts, "num_experts / num_local_experts");
  set.value("--moe-ffn-hidden-size", m.moe_ffn_hidden_size, hf.moe_ffn_hidden_size,
            "moe_intermediate_size / intermediate_size");
  set.value("--moe-router-topk", m.topk, hf.topk, "num_experts_per_tok");
  set.value("--moe-router-score-function", m.score_function, hf.score_function, "model_type");
  set.flag("--moe-router-pre-softmax", m.pre_softmax, hf.pre_softmax, "norm_topk_prob");
  set.value("--moe-shared-expert-intermediate-size", m.shared_expert_intermediate_size,
            hf.shared_expert_intermediate_size, "shared_expert_intermediate_size");
  set.flag("--moe-shared-expert-gate", m.shared_expert_gate, hf.shared_expert_gate, "model_type");
  auto every_layer = [&](std::vector<bool> p) {
    return p.empty() ? std::vector<bool>(static_cast<size_t>(a.model.num_layers), true) : p;
  };
  if (set.given("--moe-layer-freq") &&
      every_layer(moe_layer_pattern(a.moe_layer_freq, a.model.num_layers)) != every_layer(hf.layer_pattern))
    fail("--moe-layer-freq conflicts with {} (decoder_sparse_step / mlp_only_layers); drop the flag, the model's "
         "layers come from its config",
         set.where);
  m.layer_pattern = hf.layer_pattern;
  if (!set.given("--moe-aux-loss-coeff")) m.aux_loss_coeff = hf.aux_loss_coeff;  // pretrain says so
}

}  // namespace

void apply_hf_config(Arguments& a, const checkpoint::HfSpec& s, const std::string& where) {
  auto& m = a.model;
  const auto& c = s.cfg;
  Setter set{a, where};
  set.value("--num-layers", m.num_layers, c.num_layers, "num_hidden_layers");
  set.value("--hidden-size", m.hidden_size, c.hidden_size, "hidden_size");
  set.value("--ffn-hidden-size", m.ffn_hidden_size, c.ffn_hidden_size, "intermediate_size");
  set.value("--num-attention-heads", m.num_attention_heads, c.num_attention_heads, "num_attention_heads");
  set.value("--num-query-groups", m.num_query_groups, c.num_query_groups, "num_key_value_heads");
  a.group_query_attention = true;  // groups == heads is plain multi-head attention
  set.value("--kv-channels", m.kv_channels, c.kv_channels, "head_dim");
  if (c.position_embedding_type == "learned_absolute")
    set.value("--max-position-embeddings", m.max_position_embeddings, c.max_position_embeddings, "n_positions");
  else
    m.max_position_embeddings = c.max_position_embeddings;
  set.value("--normalization", m.normalization, c.normalization, "model_type");
  set.value("--norm-epsilon", m.norm_epsilon, c.norm_epsilon, "rms_norm_eps / layer_norm_epsilon");
  set.flag("--swiglu", m.swiglu, c.swiglu, "hidden_act");
  set.flag("--openai-gelu", m.openai_gelu, c.openai_gelu, "activation_function");
  set.value("--position-embedding-type", m.position_embedding_type, c.position_embedding_type, "model_type");
  if (c.rope()) {
    set.value("--rotary-base", m.rotary_base, c.rotary_base, "rope_theta");
    set.value("--rotary-percent", m.rotary_percent, c.rotary_percent, "partial_rotary_factor");
  }
  if (set.given("--disable-bias-linear") && c.add_bias_linear)
    fail("--disable-bias-linear conflicts with {} (the model has biases)", where);
  m.add_bias_linear = c.add_bias_linear;
  set.flag("--add-qkv-bias", m.add_qkv_bias, c.add_qkv_bias, "model_type");
  m.add_qkv_bias = c.add_qkv_bias;
  set.flag("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights,
           c.untie_embeddings_and_output_weights, "tie_word_embeddings");
  set.flag("--qk-layernorm", m.qk_layernorm, c.qk_layernorm, "model_type");
  set.flag("--use-rope-scaling", m.rope_scaling, c.rope_scaling, "rope_scaling");
  if (c.rope_scaling) set.value("--rope-scaling-factor", m.rope_scaling_factor, c.rope_scaling_factor, "rope_scaling.factor");
  m.rope_low_freq_factor = c.rope_low_freq_factor;
  m.rope_high_freq_factor = c.rope_high_freq_factor;
  m.rope_original_max_position = c.rope_original_max_position;
  apply_hf_moe(set, a, c.moe);
}

void apply_hf_vocab(Arguments& a, const checkpoint::HfSpec& s, int64_t tokenizer_vocab, const std::string& where) {
  if (tokenizer_vocab > s.vocab_size)
    fail("the tokenizer has {} tokens but {} has vocab_size {}: use the model's own tokenizer", tokenizer_vocab, where,
         s.vocab_size);
  a.model.orig_vocab_size = s.vocab_size;
  a.model.vocab_size =
      model::padded_vocab_size(s.vocab_size, a.make_vocab_size_divisible_by, a.tensor_model_parallel_size);
}

}  // namespace mt
