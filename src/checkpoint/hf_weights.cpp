#include "checkpoint/hf_weights.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/io_util.h"
#include "checkpoint/json_fields.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

HfTensors::HfTensors(const std::string& dir) : dir_(dir) {
  const fs::path d(dir), index = d / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(index)) {
    nlohmann::json j = parse_json_file(index, "HuggingFace model");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("'{}' has no weight_map: not a safetensors index", index.string());
    std::map<std::string, size_t> file_idx;
    for (auto& [tensor, file] : j["weight_map"].items()) {
      const std::string f = json_string(file, fmt::format("'{}': weight_map.{}", index.string(), tensor.substr(0, 200)));
      if (!is_plain_file_name(f))
        fail("'{}': shard name '{}' points outside the directory", index.string(), f.substr(0, 200));
      if (!file_idx.count(f)) {
        file_idx[f] = files_.size();
        files_.emplace_back((d / f).string());
      }
      const SafetensorsFile& sf = files_[file_idx[f]];
      if (!sf.has(tensor)) fail("'{}' lists '{}' in '{}', which does not hold it", index.string(), tensor, f);
      where_[tensor] = file_idx[f];
    }
  } else if (fs::exists(d / "model.safetensors")) {
    files_.emplace_back((d / "model.safetensors").string());
    for (const auto& n : files_[0].names()) where_[n] = 0;
  } else {
    fail("'{}' has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  for (const auto& [n, i] : where_) used_[n] = false;
}

std::vector<float> HfTensors::read(const std::string& name, const Shape& expected) {
  auto it = where_.find(name);
  if (it == where_.end())
    fail("tensor '{}' is missing from HuggingFace model '{}' (config.json describes a model this checkpoint is not?)",
         name, dir_);
  std::vector<float> v(static_cast<size_t>(shape_numel(expected)));
  files_[it->second].read_f32(name, expected, v.data());
  used_[name] = true;
  return v;
}

std::vector<std::string> HfTensors::unused() const {
  std::vector<std::string> out;
  for (const auto& [n, u] : used_)
    if (!u) out.push_back(n);
  return out;
}

std::string gpt2_prefix(const HfTensors& t) { return t.has("transformer.wte.weight") ? "transformer." : ""; }

namespace {

// One MoE layer's MLP: `m` and `h` end in the layer's "decoder.layers.L." / "model.layers.L.".
// Megatron Core's SequentialMLP names (global expert index e) on one side; Mixtral's
// block_sparse_moe (w1 gate, w3 up, w2 down) or Qwen's mlp (gate_proj, up_proj, down_proj and
// the gated shared_expert) on the other.
void add_moe_rules(const HfSpec& s, const std::string& m, const std::string& h, std::vector<HfRule>& r) {
  const auto& moe = s.cfg.moe;
  const bool mixtral = s.arch == "mixtral";
  const std::string hm = h + (mixtral ? "block_sparse_moe." : "mlp."), mm = m + "mlp.";
  r.push_back({HfRule::Copy, mm + "router.weight", {hm + "gate.weight"}});
  for (int64_t e = 0; e < moe.num_experts; ++e) {
    const std::string me = mm + "experts.local_experts." + std::to_string(e) + ".",
                      he = hm + "experts." + std::to_string(e) + ".";
    if (mixtral) {
      r.push_back({HfRule::Fc1, me + "linear_fc1.weight", {he + "w1.weight", he + "w3.weight"}});
      r.push_back({HfRule::Copy, me + "linear_fc2.weight", {he + "w2.weight"}});
    } else {
      r.push_back({HfRule::Fc1, me + "linear_fc1.weight", {he + "gate_proj.weight", he + "up_proj.weight"}});
      r.push_back({HfRule::Copy, me + "linear_fc2.weight", {he + "down_proj.weight"}});
    }
  }
  if (moe.shared_expert_intermediate_size > 0) {
    const std::string hs = hm + "shared_expert.", ms = mm + "shared_experts.";
    r.push_back({HfRule::Fc1, ms + "linear_fc1.weight", {hs + "gate_proj.weight", hs + "up_proj.weight"}});
    r.push_back({HfRule::Copy, ms + "linear_fc2.weight", {hs + "down_proj.weight"}});
    if (moe.shared_expert_gate) r.push_back({HfRule::Copy, ms + "gate_weight", {hm + "shared_expert_gate.weight"}});
  }
}

// HF stores a norm's full scale; a --apply-layernorm-1p model stores it minus 1.
std::vector<float> shift_norm(std::vector<float> v, const model::TransformerConfig& c, float by) {
  if (c.layernorm_zero_centered_gamma)
    for (float& x : v) x += by;
  return v;
}

}  // namespace

std::vector<HfRule> hf_rules(const HfSpec& s, const std::string& gp) {
  const auto& c = s.cfg;
  std::vector<HfRule> r;
  auto add = [&](HfRule::Kind k, std::string m, std::vector<std::string> h) { r.push_back({k, std::move(m), std::move(h)}); };
  if (s.arch == "gpt2") {
    add(HfRule::Vocab, "embedding.word_embeddings.weight", {gp + "wte.weight"});
    add(HfRule::Copy, "embedding.position_embeddings.weight", {gp + "wpe.weight"});
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string m = "decoder.layers." + std::to_string(i) + ".", h = gp + "h." + std::to_string(i) + ".";
      for (const char* wb : {"weight", "bias"}) {
        const std::string x = wb;
        add(x == "weight" ? HfRule::Norm : HfRule::Copy, m + "input_layernorm." + x, {h + "ln_1." + x});
        add(HfRule::Gpt2Qkv, m + "self_attention.linear_qkv." + x, {h + "attn.c_attn." + x});
        add(x == "weight" ? HfRule::Transpose : HfRule::Copy, m + "self_attention.linear_proj." + x, {h + "attn.c_proj." + x});
        add(x == "weight" ? HfRule::Norm : HfRule::Copy, m + "pre_mlp_layernorm." + x, {h + "ln_2." + x});
        add(x == "weight" ? HfRule::Transpose : HfRule::Copy, m + "mlp.linear_fc1." + x, {h + "mlp.c_fc." + x});
        add(x == "weight" ? HfRule::Transpose : HfRule::Copy, m + "mlp.linear_fc2." + x, {h + "mlp.c_proj." + x});
      }
    }
    add(HfRule::Norm, "decoder.final_layernorm.weight", {gp + "ln_f.weight"});
    add(HfRule::Copy, "decoder.final_layernorm.bias", {gp + "ln_f.bias"});
    if (c.untie_embeddings_and_output_weights) add(HfRule::Vocab, "output_layer.weight", {"lm_head.weight"});
    return r;
  }
  add(HfRule::Vocab, "embedding.word_embeddings.weight", {"model.embed_tokens.weight"});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string m = "decoder.layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
    add(HfRule::Norm, m + "input_layernorm.weight", {h + "input_layernorm.weight"});
    add(HfRule::Qkv, m + "self_attention.linear_qkv.weight",
        {h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight"});
    if (c.add_qkv_bias)
      add(HfRule::Qkv, m + "self_attention.linear_qkv.bias",
          {h + "self_attn.q_proj.bias", h + "self_attn.k_proj.bias", h + "self_attn.v_proj.bias"});
    add(HfRule::Copy, m + "self_attention.linear_proj.weight", {h + "self_attn.o_proj.weight"});
    if (c.qk_layernorm) {
      add(HfRule::Norm, m + "self_attention.q_layernorm.weight", {h + "self_attn.q_norm.weight"});
      add(HfRule::Norm, m + "self_attention.k_layernorm.weight", {h + "self_attn.k_norm.weight"});
    }
    add(HfRule::Norm, m + "pre_mlp_layernorm.weight", {h + "post_attention_layernorm.weight"});
    if (c.moe.is_moe_layer(i)) {
      add_moe_rules(s, m, h, r);
      continue;
    }
    add(HfRule::Fc1, m + "mlp.linear_fc1.weight", {h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"});
    add(HfRule::Copy, m + "mlp.linear_fc2.weight", {h + "mlp.down_proj.weight"});
  }
  add(HfRule::Norm, "decoder.final_layernorm.weight", {"model.norm.weight"});
  if (c.untie_embeddings_and_output_weights) add(HfRule::Vocab, "output_layer.weight", {"lm_head.weight"});
  return r;
}

namespace {

int64_t cols_of(const Shape& s) {
  int64_t c = 1;
  for (size_t i = 1; i < s.size(); ++i) c *= s[i];
  return c;
}

std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) y[static_cast<size_t>(j * rows + i)] = x[static_cast<size_t>(i * cols + j)];
  return y;
}

// Per query group g: rows of q heads [g*qpg, (g+1)*qpg), then k head g, then v head g; each head
// is `d` rows of `cols`.
void pack_qkv(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t G,
              int64_t qpg, int64_t d, int64_t cols, float* out) {
  const int64_t hr = d * cols;  // one head's elements
  for (int64_t g = 0; g < G; ++g) {
    float* o = out + g * (qpg + 2) * hr;
    std::copy_n(q.data() + g * qpg * hr, qpg * hr, o);
    std::copy_n(k.data() + g * hr, hr, o + qpg * hr);
    std::copy_n(v.data() + g * hr, hr, o + (qpg + 1) * hr);
  }
}

void unpack_qkv(const float* in, int64_t G, int64_t qpg, int64_t d, int64_t cols, std::vector<float>& q,
                std::vector<float>& k, std::vector<float>& v) {
  const int64_t hr = d * cols;
  q.resize(static_cast<size_t>(G * qpg * hr));
  k.resize(static_cast<size_t>(G * hr));
  v.resize(static_cast<size_t>(G * hr));
  for (int64_t g = 0; g < G; ++g) {
    const float* i = in + g * (qpg + 2) * hr;
    std::copy_n(i, qpg * hr, q.data() + g * qpg * hr);
    std::copy_n(i + qpg * hr, hr, k.data() + g * hr);
    std::copy_n(i + (qpg + 1) * hr, hr, v.data() + g * hr);
  }
}

Shape rows_shape(int64_t rows, const Shape& like) {
  Shape s = like;
  s[0] = rows;
  return s;
}

}  // namespace

std::vector<float> import_tensor(const HfSpec& s, const HfRule& r, HfTensors& src, const Shape& shape) {
  const auto& c = s.cfg;
  const int64_t cols = cols_of(shape);
  std::vector<float> out(static_cast<size_t>(shape_numel(shape)), 0.f);
  switch (r.kind) {
    case HfRule::Copy: return src.read(r.hf[0], shape);
    case HfRule::Norm: return shift_norm(src.read(r.hf[0], shape), c, -1.0f);
    case HfRule::Transpose: return transpose(src.read(r.hf[0], {shape[1], shape[0]}), shape[1], shape[0]);
    case HfRule::Vocab: {
      if (shape[0] < s.vocab_size) fail("'{}': padded vocabulary {} is smaller than the model's {}", r.megatron, shape[0], s.vocab_size);
      auto v = src.read(r.hf[0], rows_shape(s.vocab_size, shape));
      std::copy(v.begin(), v.end(), out.begin());  // padding rows stay zero
      return out;
    }
    case HfRule::Fc1: {
      const int64_t f = shape[0] / 2;
      auto g = src.read(r.hf[0], rows_shape(f, shape)), u = src.read(r.hf[1], rows_shape(f, shape));
      std::copy(g.begin(), g.end(), out.begin());
      std::copy(u.begin(), u.end(), out.begin() + static_cast<std::ptrdiff_t>(g.size()));
      return out;
    }
    case HfRule::Qkv: {
      const int64_t G = c.num_query_groups, qpg = c.num_attention_heads / G, d = c.kv_channels;
      auto q = src.read(r.hf[0], rows_shape(G * qpg * d, shape)), k = src.read(r.hf[1], rows_shape(G * d, shape)),
           v = src.read(r.hf[2], rows_shape(G * d, shape));
      pack_qkv(q, k, v, G, qpg, d, cols, out.data());
      return out;
    }
    case HfRule::Gpt2Qkv: {
      const int64_t h = c.hidden_size, n = c.num_attention_heads, d = c.kv_channels;
      std::vector<float> t = shape.size() == 2 ? transpose(src.read(r.hf[0], {shape[1], shape[0]}), shape[1], shape[0])
                                               : src.read(r.hf[0], shape);
      // t is [q; k; v] rows, each h = n heads of d rows: MHA, one head per group.
      const size_t third = static_cast<size_t>(h * cols);
      std::vector<float> q(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(third)),
          k(t.begin() + static_cast<std::ptrdiff_t>(third), t.begin() + static_cast<std::ptrdiff_t>(2 * third)),
          v(t.begin() + static_cast<std::ptrdiff_t>(2 * third), t.end());
      pack_qkv(q, k, v, n, 1, d, cols, out.data());
      return out;
    }
  }
  return out;
}

std::vector<HfTensor> export_tensor(const HfSpec& s, const HfRule& r, const std::vector<float>& m, const Shape& shape) {
  const auto& c = s.cfg;
  const int64_t cols = cols_of(shape);
  switch (r.kind) {
    case HfRule::Copy: return {{r.hf[0], shape, m}};
    case HfRule::Norm: return {{r.hf[0], shape, shift_norm(m, c, 1.0f)}};
    case HfRule::Transpose: return {{r.hf[0], {shape[1], shape[0]}, transpose(m, shape[0], shape[1])}};
    case HfRule::Vocab:
      return {{r.hf[0], rows_shape(s.vocab_size, shape),
               std::vector<float>(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(s.vocab_size * cols))}};
    case HfRule::Fc1: {
      const int64_t f = shape[0] / 2;
      const auto mid = m.begin() + static_cast<std::ptrdiff_t>(f * cols);
      return {{r.hf[0], rows_shape(f, shape), std::vector<float>(m.begin(), mid)},
              {r.hf[1], rows_shape(f, shape), std::vector<float>(mid, m.end())}};
    }
    case HfRule::Qkv: {
      const int64_t G = c.num_query_groups, qpg = c.num_attention_heads / G, d = c.kv_channels;
      std::vector<HfTensor> out(3);
      unpack_qkv(m.data(), G, qpg, d, cols, out[0].values, out[1].values, out[2].values);
      out[0].shape = rows_shape(G * qpg * d, shape);
      out[1].shape = out[2].shape = rows_shape(G * d, shape);
      for (size_t i = 0; i < 3; ++i) out[i].name = r.hf[i];
      return out;
    }
    case HfRule::Gpt2Qkv: {
      const int64_t n = c.num_attention_heads, d = c.kv_channels;
      std::vector<float> q, k, v;
      unpack_qkv(m.data(), n, 1, d, cols, q, k, v);
      std::vector<float> t;
      for (auto* x : {&q, &k, &v}) t.insert(t.end(), x->begin(), x->end());
      if (shape.size() == 2) return {{r.hf[0], {shape[1], shape[0]}, transpose(t, shape[0], shape[1])}};
      return {{r.hf[0], shape, t}};
    }
  }
  return {};
}

}  // namespace mt::checkpoint
