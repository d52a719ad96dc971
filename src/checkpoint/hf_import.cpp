#include "checkpoint/hf_import.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/hf_weights.h"
#include "checkpoint/io_util.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint {

namespace {

bool ends_with(const std::string& n, const std::string& x) {
  return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
}

// Buffers HF keeps in some checkpoints that are not weights.
bool ignorable(const std::string& n, bool tied) {
  return ends_with(n, "rotary_emb.inv_freq") || ends_with(n, "attn.bias") || ends_with(n, "attn.masked_bias") ||
         (tied && n == "lm_head.weight");
}

void check_same(const char* what, int64_t model, int64_t hf, const std::string& dir) {
  if (model != hf)
    fail("HuggingFace model '{}' has {} {} but the model being loaded has {} (flags that conflict with its "
         "config.json?)",
         dir, what, hf, model);
}

}  // namespace

void load_hf_weights(const std::string& dir, model::ParamStore& params, const model::TransformerConfig& cfg,
                     bool all_local) {
  HfSpec spec = read_hf_config(dir);
  check_same("layers", cfg.num_layers, spec.cfg.num_layers, dir);
  check_same("hidden size", cfg.hidden_size, spec.cfg.hidden_size, dir);
  check_same("attention heads", cfg.num_attention_heads, spec.cfg.num_attention_heads, dir);
  check_same("query groups", cfg.num_query_groups, spec.cfg.num_query_groups, dir);
  check_same("vocabulary entries", cfg.orig_vocab_size, spec.vocab_size, dir);
  check_same("experts", cfg.moe.num_experts, spec.cfg.moe.num_experts, dir);
  spec.cfg = cfg;  // the shapes the model was built with (padded vocabulary)
  HfTensors src(dir);
  std::map<std::string, const HfRule*> by_name;
  const auto rules = hf_rules(spec, spec.arch == "gpt2" ? gpt2_prefix(src) : "");
  for (const auto& r : rules) by_name[r.megatron] = &r;
  const bool on_host = params.device() == Device::CPU;
  Tensor host = on_host ? params.main_buffer() : params.main_buffer().to_device(Device::CPU);
  for (auto& p : params.params()) {
    auto it = by_name.find(p.name);
    if (it == by_name.end() && ends_with(p.name, ".mlp.router.expert_bias")) {
      // HF MoE models have no aux-loss-free expert bias: fine-tuning with one starts it at zero.
      std::fill_n(host.data<float>() + p.offset, p.numel(), 0.f);
      continue;
    }
    if (it == by_name.end())
      fail("the model has parameter '{}', which a {} HuggingFace model does not provide (flags that conflict with "
           "'{}/config.json'?)",
           p.name, spec.arch, dir);
    std::vector<float> full = import_tensor(spec, *it->second, src, p.full_shape);
    model::extract_shard(p, full.data(), host.data<float>() + p.offset);
  }
  if (!on_host) params.main_buffer().copy_from(host);
  params.sync_model_from_main();
  if (all_local) {
    const bool tied = !cfg.untie_embeddings_and_output_weights;
    for (const auto& n : src.unused())
      if (!ignorable(n, tied))
        fail("HuggingFace model '{}' holds tensor '{}' that a {} model has no place for (another architecture?)", dir,
             n, spec.arch);
  }
}

void write_hf_model(const std::string& out_dir, const HfSpec& spec,
                    const std::function<std::vector<float>(const std::string&)>& get,
                    const std::function<Shape(const std::string&)>& shape_of, const HfExportOptions& o) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail("--output: cannot create directory '{}': {}", out_dir, ec.message());
  // Convert everything first (in the output dtype), then cut it into shards in order.
  struct Out {
    std::string name;
    Shape shape;
    Tensor data;
  };
  std::vector<Out> outs;
  int64_t total = 0;
  for (const auto& r : hf_rules(spec)) {
    const Shape shape = shape_of(r.megatron);
    for (auto& t : export_tensor(spec, r, get(r.megatron), shape)) {
      Tensor x = Tensor::from_vector(t.values, t.shape);
      if (o.dtype != DType::F32) x = x.to(o.dtype);
      total += static_cast<int64_t>(x.nbytes());
      outs.push_back({t.name, t.shape, std::move(x)});
    }
  }
  std::vector<std::vector<size_t>> shards(1);
  int64_t cur = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(outs[i].data.nbytes());
    if (cur > 0 && cur + n > o.max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorEntry> entries;
    for (size_t i : shards[s]) {
      entries.push_back({outs[i].name, o.dtype, outs[i].shape, outs[i].data.raw(), outs[i].data.nbytes()});
      weight_map[outs[i].name] = file;
    }
    write_safetensors((fs::path(out_dir) / file).string(), entries, {{"format", "pt"}});  // transformers expects "pt"
  }
  if (shards.size() > 1)
    write_text_durable(fs::path(out_dir) / "model.safetensors.index.json",
                       nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2));
  HfSpec s = spec;
  s.dtype = o.dtype;
  write_text_durable(fs::path(out_dir) / "config.json", make_hf_config(s, o.v5_style).dump(2));
}

}  // namespace mt::checkpoint
