#include "checkpoint/hf_config.h"

#include <filesystem>

#include "checkpoint/io_util.h"
#include "core/error.h"
#include "core/log.h"

namespace mt::checkpoint {

namespace {

const char* kSupported = "llama, mistral, qwen2, qwen3, gpt2";

// A float setting as the decimal it was written as (1e-05, not 9.999999747378752e-06).
double shortest(float x) { return std::stod(fmt::format("{}", x)); }

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T dflt) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->get<T>();
}

// The rope settings: rope_parameters (5.x) or rope_theta + rope_scaling (4.x, "type" in older ones).
void read_rope(const nlohmann::json& j, HfSpec& s, const std::string& where) {
  nlohmann::json scaling;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    s.v5_style = true;
    scaling = j["rope_parameters"];
    s.cfg.rotary_base = get_or<double>(scaling, "rope_theta", get_or<double>(j, "rope_theta", 10000.0));
  } else {
    s.cfg.rotary_base = get_or<double>(j, "rope_theta", 10000.0);
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) scaling = j["rope_scaling"];
  }
  if (scaling.is_null()) return;
  const std::string type = scaling.contains("rope_type") ? scaling["rope_type"].get<std::string>()
                                                         : get_or<std::string>(scaling, "type", "default");
  if (type == "default") return;
  if (type != "llama3")
    fail("{}: rope_scaling type '{}' is not supported (megatron.cpp implements 'llama3', Llama 3.1's, and none)",
         where, type);
  auto& c = s.cfg;
  c.rope_scaling = true;
  c.rope_scaling_factor = get_or<double>(scaling, "factor", 8.0);
  c.rope_low_freq_factor = get_or<double>(scaling, "low_freq_factor", 1.0);
  c.rope_high_freq_factor = get_or<double>(scaling, "high_freq_factor", 4.0);
  c.rope_original_max_position = get_or<int64_t>(scaling, "original_max_position_embeddings", 8192);
}

void read_llama_like(const nlohmann::json& j, HfSpec& s, const std::string& where) {
  auto& c = s.cfg;
  c.num_layers = j.at("num_hidden_layers");
  c.hidden_size = j.at("hidden_size");
  c.ffn_hidden_size = j.at("intermediate_size");
  c.num_attention_heads = j.at("num_attention_heads");
  c.num_query_groups = get_or<int64_t>(j, "num_key_value_heads", c.num_attention_heads);
  c.kv_channels = get_or<int64_t>(j, "head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = get_or<int64_t>(j, "max_position_embeddings", 4096);
  c.normalization = "RMSNorm";
  c.norm_epsilon = static_cast<float>(get_or<double>(j, "rms_norm_eps", 1e-6));
  const std::string act = get_or<std::string>(j, "hidden_act", "silu");
  if (act != "silu") fail("{}: hidden_act '{}' is not supported for {} (SwiGLU needs 'silu')", where, act, s.arch);
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.rotary_percent = static_cast<float>(get_or<double>(j, "partial_rotary_factor", 1.0));
  read_rope(j, s, where);
  const bool attn_bias = get_or<bool>(j, "attention_bias", false), mlp_bias = get_or<bool>(j, "mlp_bias", false);
  if (attn_bias || mlp_bias)
    fail("{}: attention_bias / mlp_bias are not supported for {} (megatron.cpp has biases on all linear layers or on "
         "the QKV projection only)",
         where, s.arch);
  c.add_bias_linear = false;
  c.add_qkv_bias = s.arch == "qwen2";
  c.qk_layernorm = s.arch == "qwen3";
  c.untie_embeddings_and_output_weights = !get_or<bool>(j, "tie_word_embeddings", false);
  const bool sliding = s.arch == "mistral" ? !get_or<nlohmann::json>(j, "sliding_window", nullptr).is_null()
                                           : get_or<bool>(j, "use_sliding_window", false);
  if (sliding)
    log_warn("{}: sliding-window attention is not implemented; results match only for sequences within the window "
             "({} tokens)",
             where, get_or<int64_t>(j, "sliding_window", 0));
}

void read_gpt2(const nlohmann::json& j, HfSpec& s, const std::string& where) {
  auto& c = s.cfg;
  c.num_layers = j.at("n_layer");
  c.hidden_size = j.at("n_embd");
  c.num_attention_heads = j.at("n_head");
  c.num_query_groups = c.num_attention_heads;
  c.kv_channels = c.hidden_size / c.num_attention_heads;
  c.ffn_hidden_size = get_or<int64_t>(j, "n_inner", 4 * c.hidden_size);
  c.max_position_embeddings = get_or<int64_t>(j, "n_positions", 1024);
  c.normalization = "LayerNorm";
  c.norm_epsilon = static_cast<float>(get_or<double>(j, "layer_norm_epsilon", 1e-5));
  const std::string act = get_or<std::string>(j, "activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.openai_gelu = true;
  else if (act != "gelu") fail("{}: activation_function '{}' is not supported for gpt2", where, act);
  c.position_embedding_type = "learned_absolute";
  c.add_bias_linear = c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = !get_or<bool>(j, "tie_word_embeddings", true);
  if (get_or<bool>(j, "scale_attn_by_inverse_layer_idx", false) || get_or<bool>(j, "reorder_and_upcast_attn", false) ||
      !get_or<bool>(j, "scale_attn_weights", true))
    fail("{}: GPT-2 attention-scaling variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
         "scale_attn_weights false) are not supported",
         where);
}

}  // namespace

DType hf_dtype(const std::string& name, const std::string& what) {
  if (name == "float32" || name == "fp32") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "float16" || name == "fp16") return DType::F16;
  fail("{}: dtype '{}' is not supported (float32, bfloat16 or float16)", what, name);
}

std::string hf_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: return "float32";
  }
}

HfSpec parse_hf_config(const nlohmann::json& j, const std::string& where) {
  HfSpec s;
  s.raw = j;
  try {
    s.arch = get_or<std::string>(j, "model_type", "");
    if (s.arch == "mixtral" || s.arch == "qwen2_moe" || s.arch == "qwen3_moe")
      fail("{}: model_type '{}' needs mixture-of-experts layers, which megatron.cpp does not implement yet", where,
           s.arch);
    if (s.arch == "llama" || s.arch == "mistral" || s.arch == "qwen2" || s.arch == "qwen3") read_llama_like(j, s, where);
    else if (s.arch == "gpt2") read_gpt2(j, s, where);
    else fail("{}: model_type '{}' is not supported (supported: {})", where, s.arch, kSupported);
    s.vocab_size = j.at("vocab_size");
    s.cfg.vocab_size = s.vocab_size;
    s.cfg.orig_vocab_size = s.vocab_size;
    if (j.contains("dtype") && j["dtype"].is_string()) {
      s.v5_style = true;
      s.dtype = hf_dtype(j["dtype"], where + " dtype");
    } else if (j.contains("torch_dtype") && j["torch_dtype"].is_string()) {
      s.dtype = hf_dtype(j["torch_dtype"], where + " torch_dtype");
    }
    s.cfg.seq_length = std::min<int64_t>(s.cfg.max_position_embeddings, 4096);
    s.cfg.attention_dropout = s.cfg.hidden_dropout = 0.f;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: missing or malformed key: {}", where, e.what());
  }
  return s;
}

HfSpec read_hf_config(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "config.json";
  if (!std::filesystem::exists(path)) fail("'{}' has no config.json: not a HuggingFace model directory", dir);
  return parse_hf_config(parse_json_file(path), path.string());
}

std::string infer_hf_arch(const model::TransformerConfig& c) {
  if (c.position_embedding_type == "learned_absolute" && !c.rmsnorm()) return "gpt2";
  if (c.qk_layernorm) return "qwen3";
  if (c.add_qkv_bias && !c.add_bias_linear) return "qwen2";
  return "llama";
}

nlohmann::json make_hf_config(const HfSpec& s, bool v5) {
  const auto& c = s.cfg;
  nlohmann::json j = s.raw.is_object() ? s.raw : nlohmann::json::object();
  for (const char* k : {"rope_theta", "rope_scaling", "rope_parameters", "torch_dtype", "dtype"}) j.erase(k);
  const bool tied = !c.untie_embeddings_and_output_weights;
  j["model_type"] = s.arch;
  j["vocab_size"] = s.vocab_size;
  j["tie_word_embeddings"] = tied;
  j[v5 ? "dtype" : "torch_dtype"] = hf_dtype_name(s.dtype);
  if (s.arch == "gpt2") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["n_layer"] = c.num_layers;
    j["n_embd"] = c.hidden_size;
    j["n_head"] = c.num_attention_heads;
    j["n_inner"] = c.ffn_hidden_size == 4 * c.hidden_size ? nlohmann::json(nullptr) : nlohmann::json(c.ffn_hidden_size);
    j["n_positions"] = c.max_position_embeddings;
    j["layer_norm_epsilon"] = shortest(c.norm_epsilon);
    j["activation_function"] = c.openai_gelu ? "gelu_new" : "gelu";
    return j;
  }
  static const std::map<std::string, std::string> cls = {{"llama", "LlamaForCausalLM"},
                                                         {"mistral", "MistralForCausalLM"},
                                                         {"qwen2", "Qwen2ForCausalLM"},
                                                         {"qwen3", "Qwen3ForCausalLM"}};
  j["architectures"] = {cls.at(s.arch)};
  j["num_hidden_layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.ffn_hidden_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_query_groups;
  j["head_dim"] = c.kv_channels;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = shortest(c.norm_epsilon);
  if (s.arch == "llama" || s.arch == "qwen3") j["attention_bias"] = false;
  if (s.arch == "llama") j["mlp_bias"] = false;
  if (c.rotary_percent != 1.0f) j["partial_rotary_factor"] = c.rotary_percent;
  nlohmann::json scaling = nullptr;
  if (c.rope_scaling)
    scaling = {{"rope_type", "llama3"},
               {"factor", c.rope_scaling_factor},
               {"low_freq_factor", c.rope_low_freq_factor},
               {"high_freq_factor", c.rope_high_freq_factor},
               {"original_max_position_embeddings", c.rope_original_max_position}};
  if (v5) {
    nlohmann::json rp = scaling.is_null() ? nlohmann::json{{"rope_type", "default"}} : scaling;
    rp["rope_theta"] = c.rotary_base;
    j["rope_parameters"] = rp;
  } else {
    j["rope_theta"] = c.rotary_base;
    j["rope_scaling"] = scaling;
  }
  return j;
}

}  // namespace mt::checkpoint
