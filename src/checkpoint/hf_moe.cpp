#include "checkpoint/hf_moe.h"

#include <algorithm>

#include "checkpoint/model_bounds.h"
#include "core/error.h"
#include "core/log.h"

namespace mt::checkpoint {

namespace {

// transformers' defaults, for configs that leave a key out (as a config made with defaults may).
struct MoEDefaults {
  int64_t experts, topk, moe_ffn;
};
MoEDefaults defaults_of(const std::string& arch) {
  if (arch == "mixtral") return {8, 2, 0};
  if (arch == "qwen2_moe") return {60, 4, 1408};
  return {128, 8, 768};  // qwen3_moe
}

// Qwen's rule (transformers' Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer).
std::vector<bool> qwen_pattern(int64_t layers, int64_t step, const std::vector<int64_t>& mlp_only) {
  std::vector<bool> p(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l)
    p[static_cast<size_t>(l)] =
        std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && (l + 1) % step == 0;
  return p;
}

// MoEConfig keeps "every layer" as the empty pattern.
std::vector<bool> full_pattern(const model::MoEConfig& m, int64_t layers) {
  return m.layer_pattern.empty() ? std::vector<bool>(static_cast<size_t>(layers), true) : m.layer_pattern;
}

// mlp_only_layers: null or a list of layer indices.
std::vector<int64_t> mlp_only_layers(const JsonFields& f, int64_t layers) {
  if (!f.has("mlp_only_layers")) return {};
  return json_int_array(f.at("mlp_only_layers"), f.what("mlp_only_layers"), 0, layers - 1);
}

// The key holding the expert count: Mixtral's num_local_experts; Qwen2-MoE's num_experts;
// Qwen3-MoE's num_experts in transformers 4, num_local_experts as transformers 5 writes it.
const char* experts_key(const std::string& arch, const nlohmann::json& raw, bool v5) {
  if (arch == "mixtral") return "num_local_experts";
  if (arch == "qwen2_moe") return "num_experts";
  if (raw.is_object() && raw.contains("num_local_experts")) return "num_local_experts";
  if (raw.is_object() && raw.contains("num_experts")) return "num_experts";
  return v5 ? "num_local_experts" : "num_experts";
}

// What the architecture cannot hold: refused by name on export, rather than written as a
// config whose model computes something else.
void check_exportable(const HfSpec& s) {
  const auto& c = s.cfg;
  const auto& m = c.moe;
  if (!m.enabled())
    fail("--to hf: model_type {} needs experts, but the checkpoint is a dense model; use llama, mistral, qwen2 or "
         "qwen3",
         s.arch);
  auto refuse = [&](bool bad, const char* what) {
    if (bad) fail("--to hf: the model has {}, which a HuggingFace {} model cannot hold", what, s.arch);
  };
  auto require = [&](bool missing, const char* what) {
    if (missing) fail("--to hf: the model has no {}, which a HuggingFace {} model always has", what, s.arch);
  };
  refuse(m.score_function != "softmax", "sigmoid router scores (--moe-router-score-function sigmoid)");
  refuse(m.num_groups > 0, "group-limited routing (--moe-router-num-groups)");
  refuse(m.enable_expert_bias, "an expert bias (--moe-router-enable-expert-bias)");
  refuse(m.topk_scaling_factor != 0, "routing-weight scaling (--moe-router-topk-scaling-factor)");
  refuse(m.capacity_factor > 0, "token dropping (--moe-expert-capacity-factor)");
  refuse(!c.swiglu || c.add_bias_linear, "experts other than bias-free SwiGLU MLPs (--swiglu --disable-bias-linear)");
  const bool shared = m.shared_expert_intermediate_size > 0;
  if (s.arch == "mixtral") {
    refuse(!m.layer_pattern.empty(), "dense layers (--moe-layer-freq)");
    refuse(shared, "a shared expert (--moe-shared-expert-intermediate-size)");
    refuse(m.pre_softmax, "unnormalised top-k weights (--moe-router-pre-softmax)");
  } else if (s.arch == "qwen2_moe") {
    require(!shared || !m.shared_expert_gate,
            "gated shared expert (--moe-shared-expert-intermediate-size, --moe-shared-expert-gate)");
  } else {
    refuse(shared, "a shared expert (--moe-shared-expert-intermediate-size)");
  }
  // Attention: Mixtral is Mistral's, Qwen2-MoE Qwen2's (QKV bias), Qwen3-MoE Qwen3's (q/k norms).
  if (s.arch == "qwen3_moe") require(!c.qk_layernorm, "q/k norms (--qk-layernorm)");
  else refuse(c.qk_layernorm, "q/k norms (--qk-layernorm)");
  if (s.arch != "qwen2_moe") refuse(c.add_qkv_bias, "a QKV bias (--add-qkv-bias)");
}

}  // namespace

bool is_hf_moe_arch(const std::string& arch) {
  return arch == "mixtral" || arch == "qwen2_moe" || arch == "qwen3_moe";
}

std::string hf_attention_arch(const std::string& arch) {
  if (arch == "mixtral") return "mistral";
  if (arch == "qwen2_moe") return "qwen2";
  if (arch == "qwen3_moe") return "qwen3";
  return arch;
}

void read_hf_moe(const JsonFields& f, HfSpec& s) {
  auto& c = s.cfg;
  auto& m = c.moe;
  const MoEDefaults d = defaults_of(s.arch);
  m = model::MoEConfig{};
  const char* key = f.has("num_local_experts") ? "num_local_experts" : "num_experts";
  m.num_experts = f.integer_or(key, d.experts, 1, kMaxExperts);
  m.topk = f.integer_or("num_experts_per_tok", d.topk, 1, m.num_experts);
  if (m.topk > m.num_experts)  // the default when absent: transformers would fail in torch.topk
    fail("{}: num_experts_per_tok is missing, and transformers' default for {} ({}) exceeds the {} experts; set it",
         f.where(), s.arch, m.topk, m.num_experts);
  m.aux_loss_coeff = f.number_or("router_aux_loss_coef", 0.001, 0, 1e6);
  m.score_function = "softmax";
  if (s.arch == "mixtral") {
    m.moe_ffn_hidden_size = c.ffn_hidden_size;  // Mixtral's intermediate_size is the experts'
    if (f.number_or("router_jitter_noise", 0, 0, 1e6) > 0)
      log_warn("{}: router_jitter_noise (training-time noise on the router input) is not implemented; training "
               "runs without it",
               f.where());
    return;
  }
  m.moe_ffn_hidden_size = f.integer_or("moe_intermediate_size", d.moe_ffn, 1, kMaxFfn);
  // Renormalised top-k weights are a softmax over the top-k logits: Megatron's default order.
  m.pre_softmax = !f.boolean_or("norm_topk_prob", false);
  if (s.arch == "qwen2_moe") {
    m.shared_expert_intermediate_size = f.integer_or("shared_expert_intermediate_size", 5632, 1, kMaxFfn);
    m.shared_expert_gate = true;
    c.add_qkv_bias = f.boolean_or("qkv_bias", true);  // transformers 4 always has it
  }
  const int64_t step = f.integer_or("decoder_sparse_step", 1, 1, kMaxLayers);
  m.layer_pattern = qwen_pattern(c.num_layers, step, mlp_only_layers(f, c.num_layers));
  if (std::find(m.layer_pattern.begin(), m.layer_pattern.end(), false) == m.layer_pattern.end())
    m.layer_pattern.clear();  // every layer
}

void write_hf_moe(const HfSpec& s, bool v5, nlohmann::json& j) {
  check_exportable(s);
  const auto& c = s.cfg;
  const auto& m = c.moe;
  for (const char* k : {"num_experts", "num_local_experts"}) j.erase(k);
  j[experts_key(s.arch, s.raw, v5)] = m.num_experts;
  j["num_experts_per_tok"] = m.topk;
  j["router_aux_loss_coef"] = m.aux_loss_coeff;
  if (!j.contains("output_router_logits")) j["output_router_logits"] = false;
  if (s.arch == "mixtral") {
    j["intermediate_size"] = m.moe_ffn_hidden_size;
    return;
  }
  j["moe_intermediate_size"] = m.moe_ffn_hidden_size;
  j["norm_topk_prob"] = !m.pre_softmax;
  if (s.arch == "qwen2_moe") {
    if (!c.add_qkv_bias && !v5)
      fail("--to hf: the model has no QKV bias, which transformers 4.x always gives a qwen2_moe model; write a "
           "transformers 5.x config (--hf-config-style 5, qkv_bias false)");
    j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
    j["qkv_bias"] = c.add_qkv_bias;
  }
  // The layer pattern: the config's own decoder_sparse_step / mlp_only_layers where they still
  // describe it, else step 1 with the dense layers listed.
  const std::vector<bool> want = full_pattern(m, c.num_layers);
  try {
    const JsonFields raw(s.raw, "recorded config");
    const int64_t step = raw.integer_or("decoder_sparse_step", 1, 1, kMaxLayers);
    if (qwen_pattern(c.num_layers, step, mlp_only_layers(raw, c.num_layers)) == want) return;
  } catch (const Error&) {  // no usable recorded config: write the pattern out
  }
  nlohmann::json dense = nlohmann::json::array();
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (!want[static_cast<size_t>(l)]) dense.push_back(l);
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = dense;
}

std::string infer_hf_moe_arch(const model::TransformerConfig& c) {
  if (c.qk_layernorm) return "qwen3_moe";
  if (c.moe.shared_expert_intermediate_size > 0) return "qwen2_moe";
  return "mixtral";
}

}  // namespace mt::checkpoint
