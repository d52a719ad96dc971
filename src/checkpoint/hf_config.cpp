#include "checkpoint/hf_config.h"

#include <filesystem>

#include "checkpoint/hf_moe.h"
#include "checkpoint/io_util.h"
#include "checkpoint/json_fields.h"
#include "checkpoint/model_bounds.h"
#include "core/error.h"
#include "core/log.h"

namespace mt::checkpoint {

namespace {

const char* kSupported = "llama, mistral, qwen2, qwen3, gpt2, mixtral, qwen2_moe, qwen3_moe";

// A float setting as the decimal it was written as (1e-05, not 9.999999747378752e-06).
double shortest(float x) { return std::stod(fmt::format("{}", x)); }

// A float setting that must be positive and at most `hi`.
double positive_or(const JsonFields& f, const char* key, double dflt, double hi) {
  const double x = f.number_or(key, dflt, 0, hi);
  if (x <= 0) fail("{} must be positive, got {}", f.what(key), json_brief(f.at(key)));
  return x;
}

// The same for a setting the model keeps as a float (an epsilon of 1e-50 would become 0).
float positive_float_or(const JsonFields& f, const char* key, double dflt, double hi) {
  const double x = positive_or(f, key, dflt, hi);
  if (!(static_cast<float>(x) > 0)) fail("{} is too small for a 32-bit float, got {}", f.what(key), x);
  return static_cast<float>(x);
}

// An object-valued setting (rope_scaling, rope_parameters): null when absent or null.
const nlohmann::json* object_or_null(const JsonFields& f, const char* key) {
  if (!f.has(key)) return nullptr;
  const auto& v = f.at(key);
  if (!v.is_object()) fail("{} must be an object or null, got {}", f.what(key), json_brief(v));
  return &v;
}

// The rope settings: rope_parameters (5.x) or rope_theta + rope_scaling (4.x, "type" in older ones).
void read_rope(const JsonFields& f, HfSpec& s) {
  auto& c = s.cfg;
  const double theta = positive_or(f, "rope_theta", 10000.0, 1e15);
  const nlohmann::json* scaling = object_or_null(f, "rope_parameters");
  if (scaling) s.v5_style = true;
  else scaling = object_or_null(f, "rope_scaling");
  if (!scaling) {
    c.rotary_base = theta;
    return;
  }
  const JsonFields r(*scaling, f.what(s.v5_style ? "rope_parameters" : "rope_scaling"));
  c.rotary_base = positive_or(r, "rope_theta", theta, 1e15);
  const std::string type = r.string_or("rope_type", r.string_or("type", "default"));
  if (type == "default") return;
  if (type != "llama3")
    fail("{}: rope_scaling type '{}' is not supported (megatron.cpp implements 'llama3', Llama 3.1's, and none)",
         f.where(), type.substr(0, 40));
  c.rope_scaling = true;
  c.rope_scaling_factor = positive_or(r, "factor", 8.0, 1e6);
  c.rope_low_freq_factor = positive_or(r, "low_freq_factor", 1.0, 1e6);
  c.rope_high_freq_factor = positive_or(r, "high_freq_factor", 4.0, 1e6);
  // Llama 3.1's smoothing divides by their difference.
  if (c.rope_high_freq_factor <= c.rope_low_freq_factor)
    fail("{}: high_freq_factor ({}) must exceed low_freq_factor ({})", r.where(), c.rope_high_freq_factor,
         c.rope_low_freq_factor);
  c.rope_original_max_position = r.integer_or("original_max_position_embeddings", 8192, 1, kMaxPositions);
}

// Heads, query groups and the head dimension, with the divisibility attention needs.
void read_heads(const JsonFields& f, HfSpec& s, const char* heads_key, const char* hidden_key, bool groups) {
  auto& c = s.cfg;
  c.num_attention_heads = f.integer(heads_key, 1, kMaxHeads);
  c.num_query_groups = groups ? f.integer_or("num_key_value_heads", c.num_attention_heads, 1, c.num_attention_heads)
                              : c.num_attention_heads;
  if (c.num_attention_heads % c.num_query_groups != 0)
    fail("{}: num_attention_heads ({}) must be divisible by num_key_value_heads ({})", f.where(),
         c.num_attention_heads, c.num_query_groups);
  if (groups && f.has("head_dim")) {
    c.kv_channels = f.integer("head_dim", 1, kMaxHeadDim);
    return;
  }
  if (c.hidden_size % c.num_attention_heads != 0)
    fail("{}: {} ({}) must be divisible by {} ({}){}", f.where(), hidden_key, c.hidden_size, heads_key,
         c.num_attention_heads, groups ? ", or set head_dim" : "");
  c.kv_channels = c.hidden_size / c.num_attention_heads;
}

// Llama's layout and its relatives; the MoE architectures share their attention with one of them
// (Mixtral Mistral's, Qwen2-MoE Qwen2's, Qwen3-MoE Qwen3's).
void read_llama_like(const JsonFields& f, HfSpec& s) {
  auto& c = s.cfg;
  const std::string base = hf_attention_arch(s.arch);
  c.num_layers = f.integer("num_hidden_layers", 1, kMaxLayers);
  c.hidden_size = f.integer("hidden_size", 1, kMaxHidden);
  c.ffn_hidden_size = f.integer("intermediate_size", 1, kMaxFfn);
  read_heads(f, s, "num_attention_heads", "hidden_size", true);
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 4096, 1, kMaxPositions);
  c.normalization = "RMSNorm";
  c.norm_epsilon = positive_float_or(f, "rms_norm_eps", 1e-6, 1.0);
  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu")
    fail("{}: hidden_act '{}' is not supported for {} (SwiGLU needs 'silu')", f.where(), act.substr(0, 40), s.arch);
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.rotary_percent = positive_float_or(f, "partial_rotary_factor", 1.0, 1.0);
  read_rope(f, s);
  if (f.boolean_or("attention_bias", false) || f.boolean_or("mlp_bias", false))
    fail("{}: attention_bias / mlp_bias are not supported for {} (megatron.cpp has biases on all linear layers or on "
         "the QKV projection only)",
         f.where(), s.arch);
  c.add_bias_linear = false;
  c.add_qkv_bias = base == "qwen2";
  c.qk_layernorm = base == "qwen3";
  c.untie_embeddings_and_output_weights = !f.boolean_or("tie_word_embeddings", false);
  const bool sliding = base == "mistral" ? f.has("sliding_window") : f.boolean_or("use_sliding_window", false);
  if (sliding)
    log_warn("{}: sliding-window attention is not implemented; results match only for sequences within the window "
             "({} tokens)",
             f.where(), f.integer_or("sliding_window", 0, 0, INT64_MAX));
}

void read_gpt2(const JsonFields& f, HfSpec& s) {
  auto& c = s.cfg;
  c.num_layers = f.integer("n_layer", 1, kMaxLayers);
  c.hidden_size = f.integer("n_embd", 1, kMaxHidden);
  read_heads(f, s, "n_head", "n_embd", false);
  c.ffn_hidden_size = f.integer_or("n_inner", 4 * c.hidden_size, 1, kMaxFfn);
  c.max_position_embeddings = f.integer_or("n_positions", 1024, 1, kMaxPositions);
  c.normalization = "LayerNorm";
  c.norm_epsilon = positive_float_or(f, "layer_norm_epsilon", 1e-5, 1.0);
  const std::string act = f.string_or("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.openai_gelu = true;
  else if (act != "gelu")
    fail("{}: activation_function '{}' is not supported for gpt2", f.where(), act.substr(0, 40));
  c.position_embedding_type = "learned_absolute";
  c.add_bias_linear = c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = !f.boolean_or("tie_word_embeddings", true);
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false) || f.boolean_or("reorder_and_upcast_attn", false) ||
      !f.boolean_or("scale_attn_weights", true))
    fail("{}: GPT-2 attention-scaling variants (scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn, "
         "scale_attn_weights false) are not supported",
         f.where());
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
  const JsonFields f(j, where);
  s.arch = f.string_or("model_type", "");
  const std::string base = hf_attention_arch(s.arch);
  if (base == "llama" || base == "mistral" || base == "qwen2" || base == "qwen3") read_llama_like(f, s);
  else if (s.arch == "gpt2") read_gpt2(f, s);
  else fail("{}: model_type '{}' is not supported (supported: {})", where, s.arch.substr(0, 40), kSupported);
  if (is_hf_moe_arch(s.arch)) read_hf_moe(f, s);
  s.vocab_size = f.integer("vocab_size", 1, kMaxVocab);
  s.cfg.vocab_size = s.vocab_size;
  s.cfg.orig_vocab_size = s.vocab_size;
  if (f.has("dtype")) {
    s.v5_style = true;
    s.dtype = hf_dtype(json_string(f.at("dtype"), f.what("dtype")), where);
  } else if (f.has("torch_dtype")) {
    s.dtype = hf_dtype(json_string(f.at("torch_dtype"), f.what("torch_dtype")), where);
  }
  s.cfg.seq_length = std::min<int64_t>(s.cfg.max_position_embeddings, 4096);
  s.cfg.attention_dropout = s.cfg.hidden_dropout = 0.f;
  return s;
}

HfSpec read_hf_config(const std::string& dir) {
  const auto path = std::filesystem::path(dir) / "config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("'{}' has no config.json: not a HuggingFace model directory", dir);
  return parse_hf_config(parse_json_file(path, "HuggingFace model"), path.string());
}

std::string infer_hf_arch(const model::TransformerConfig& c) {
  if (c.moe.enabled()) return infer_hf_moe_arch(c);
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
  if (c.moe.enabled() && !is_hf_moe_arch(s.arch))
    fail("--to hf: the model has experts (--num-experts {}); a HuggingFace {} model cannot hold them: use mixtral, "
         "qwen2_moe or qwen3_moe",
         c.moe.num_experts, s.arch);
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
                                                         {"qwen3", "Qwen3ForCausalLM"},
                                                         {"mixtral", "MixtralForCausalLM"},
                                                         {"qwen2_moe", "Qwen2MoeForCausalLM"},
                                                         {"qwen3_moe", "Qwen3MoeForCausalLM"}};
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
  if (s.arch == "llama" || hf_attention_arch(s.arch) == "qwen3") j["attention_bias"] = false;
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
  if (is_hf_moe_arch(s.arch)) write_hf_moe(s, v5, j);
  return j;
}

}  // namespace mt::checkpoint
