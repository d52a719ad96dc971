// Megatron-LM torch_dist checkpoints written by megatron.cpp (dcp_writer.h).
#include "checkpoint/megatron/dcp_writer.h"

#include <filesystem>
#include <map>

#include "checkpoint/io_util.h"
#include "checkpoint/megatron/pickle.h"
#include "checkpoint/megatron/torch_zip.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace mt::checkpoint::megatron {

namespace {

using pickle::Builder;
const std::string kMd = "torch.distributed.checkpoint.metadata";
const std::string kLayers = "decoder.layers.";

// A JSON value (the run's arguments) as a pickled Python value.
int64_t pickle_from_json(Builder& b, const nlohmann::json& j) {
  if (j.is_null()) return b.none();
  if (j.is_boolean()) return b.boolean(j.get<bool>());
  if (j.is_number_integer()) return b.integer(j.get<int64_t>());
  if (j.is_number()) return b.real(j.get<double>());
  if (j.is_string()) return b.str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<int64_t> items;
    for (const auto& x : j) items.push_back(pickle_from_json(b, x));
    return b.list(items);
  }
  const int64_t d = b.dict();
  for (const auto& [k, v] : j.items()) b.set(d, k, pickle_from_json(b, v));
  return d;
}

int64_t size_of(Builder& b, const std::vector<int64_t>& dims) {
  std::vector<int64_t> items;
  for (int64_t x : dims) items.push_back(b.integer(x));
  return b.call(b.global("torch", "Size"), {b.tuple(items)});
}

// One stored item: a whole tensor's chunk or a bytes object.
struct Chunk {
  std::vector<int64_t> offsets, sizes;
  uint64_t offset = 0, length = 0;
};
struct Item {
  std::string name;
  bool bytes = false;
  std::vector<int64_t> size;
  std::vector<Chunk> chunks;  // bytes: one, offsets empty
};

class Writer {
 public:
  explicit Writer(const fs::path& file) : out_(file) {}
  // Appends a stored item and returns its place.
  Chunk put(const std::string& data, std::vector<int64_t> offsets, std::vector<int64_t> sizes) {
    Chunk c{std::move(offsets), std::move(sizes), pos_, data.size()};
    out_.write(data.data(), data.size());
    pos_ += data.size();
    return c;
  }
  void close() { out_.sync_and_close(); }

 private:
  NewFile out_;
  uint64_t pos_ = 0;
};

// Megatron's module order of a layer's tensors, under its torch_dist names (the layer norms
// under the linear they precede, as Transformer Engine and Megatron's local spec name them).
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> v = {
      {"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"},
      {"input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias"},
      {"self_attention.linear_proj.weight", "self_attention.linear_proj.weight"},
      {"self_attention.linear_proj.bias", "self_attention.linear_proj.bias"},
      {"self_attention.linear_qkv.weight", "self_attention.linear_qkv.weight"},
      {"self_attention.linear_qkv.bias", "self_attention.linear_qkv.bias"},
      {"self_attention.q_layernorm.weight", "self_attention.q_layernorm.weight"},
      {"self_attention.k_layernorm.weight", "self_attention.k_layernorm.weight"},
      {"pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"},
      {"pre_mlp_layernorm.bias", "mlp.linear_fc1.layer_norm_bias"},
      {"mlp.linear_fc1.weight", "mlp.linear_fc1.weight"},
      {"mlp.linear_fc1.bias", "mlp.linear_fc1.bias"},
      {"mlp.linear_fc2.weight", "mlp.linear_fc2.weight"},
      {"mlp.linear_fc2.bias", "mlp.linear_fc2.bias"}};
  return v;
}
const std::vector<std::string> kPre = {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight"};
const std::vector<std::string> kPost = {"decoder.final_layernorm.weight", "decoder.final_layernorm.bias",
                                        "output_layer.weight"};

int64_t jint(const nlohmann::json& a, const char* k, int64_t dflt) {
  auto it = a.find(k);
  return it != a.end() && it->is_number() ? it->get<int64_t>() : dflt;
}
double jnum(const nlohmann::json& a, const char* k, double dflt) {
  auto it = a.find(k);
  return it != a.end() && it->is_number() ? it->get<double>() : dflt;
}
std::string jstr(const nlohmann::json& a, const char* k, const std::string& dflt) {
  auto it = a.find(k);
  return it != a.end() && it->is_string() ? it->get<std::string>() : dflt;
}

// Megatron's args for the checkpoint: the run's own (megatron.cpp's flag names are Megatron's),
// with the model's shape, the data position and the names Megatron's loader compares.
nlohmann::json megatron_args(const TrainingState& st) {
  const nlohmann::json& m = st.args;
  nlohmann::json a = nlohmann::json::object();
  if (auto r = m.find("run_args"); r != m.end() && r->is_object()) {
    if (r->contains("arguments") && (*r)["arguments"].is_object()) a = (*r)["arguments"];
    if (r->contains("derived") && (*r)["derived"].is_object())
      for (const auto& [k, v] : (*r)["derived"].items()) a[k] = v;
  }
  for (const char* k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                        "kv_channels", "seq_length", "max_position_embeddings", "normalization", "norm_epsilon",
                        "swiglu", "position_embedding_type", "rotary_base", "rotary_percent", "qk_layernorm",
                        "add_bias_linear", "add_qkv_bias", "untie_embeddings_and_output_weights", "bf16", "fp16",
                        "tokenizer_type"})
    if (m.contains(k)) a[k] = m[k];
  a["padded_vocab_size"] = m.value("vocab_size", int64_t{0});
  a["group_query_attention"] = m.value("num_query_groups", 0) != m.value("num_attention_heads", 0);
  // Megatron's --no-position-embedding (dest add_position_embedding, default true) is its own flag,
  // independent of --position-embedding-type; Megatron-LM's loader compares it with its own args,
  // so a rope model trained without the flag must say true here, as Megatron's checkpoints do.
  a["add_position_embedding"] = !(a.contains("no_position_embedding") && a["no_position_embedding"].is_boolean() &&
                                  a["no_position_embedding"].get<bool>());
  if (m.value("tokenizer_type", std::string()) == "NullTokenizer") a["vocab_size"] = m.value("tokenizer_vocab_size", 0);
  a["consumed_train_samples"] = st.consumed_train_samples;
  a["consumed_valid_samples"] = st.consumed_valid_samples;
  a["tensor_model_parallel_size"] = 1;
  a["pipeline_model_parallel_size"] = 1;
  a["ckpt_format"] = "torch_dist";
  // No RNG state is written: Megatron-LM's loader skips it for a checkpoint saved without.
  a["no_save_rng"] = true;
  a["world_size"] = 1;
  a["data_parallel_size"] = 1;
  a.erase("disable_bias_linear");
  a.erase("no_position_embedding");
  return a;
}

// Megatron's OptimizerParamScheduler state, in samples (its loader checks these against the
// loading run's flags unless --override-opt_param-scheduler or --use-checkpoint-opt_param-scheduler).
int64_t scheduler(Builder& b, const TrainingState& st, const nlohmann::json& a) {
  if (auto s = st.args.find("megatron_opt_param_scheduler"); s != st.args.end() && s->is_object()) {
    nlohmann::json j = *s;
    j["num_steps"] = st.scheduler_samples;
    return pickle_from_json(b, j);
  }
  const int64_t gbs = jint(a, "global_batch_size", 1), train = jint(a, "train_iters", 0) * gbs;
  const double lr = jnum(a, "lr", 1e-4), wd = jnum(a, "weight_decay", 0.01);
  const int64_t warm = jint(a, "lr_warmup_samples", 0) > 0 ? jint(a, "lr_warmup_samples", 0)
                                                          : jint(a, "lr_warmup_iters", 0) * gbs;
  const int64_t decay = jint(a, "lr_decay_samples", 0) > 0 ? jint(a, "lr_decay_samples", 0)
                        : jint(a, "lr_decay_iters", 0) > 0 ? jint(a, "lr_decay_iters", 0) * gbs
                                                          : train;
  nlohmann::json j = {{"max_lr", lr},
                      {"lr_warmup_steps", warm},
                      {"num_steps", st.scheduler_samples},
                      {"lr_decay_style", jstr(a, "lr_decay_style", "linear")},
                      {"lr_decay_steps", decay},
                      {"min_lr", jnum(a, "min_lr", 0.0)},
                      {"start_wd", jnum(a, "start_weight_decay", wd)},
                      {"end_wd", jnum(a, "end_weight_decay", wd)},
                      {"wd_incr_style", jstr(a, "weight_decay_incr_style", "constant")},
                      {"wd_incr_steps", train}};
  return pickle_from_json(b, j);
}

// The plain optimizer's param groups (weight decay, then none) and its step.
int64_t optimizer_common(Builder& b, const nlohmann::json& a) {
  std::vector<int64_t> groups;
  for (double wd_mult : {1.0, 0.0}) {
    nlohmann::json g = {{"amsgrad", false},
                        {"capturable", false},
                        {"decoupled_weight_decay", true},
                        {"default_config", true},
                        {"differentiable", false},
                        {"eps", jnum(a, "adam_eps", 1e-8)},
                        {"foreach", nullptr},
                        {"fused", nullptr},
                        {"is_decoupled_lr", false},
                        {"is_expert_parallel", false},
                        {"lr", jnum(a, "lr", 1e-4)},
                        {"lr_mult", 1.0},
                        {"max_lr", jnum(a, "lr", 1e-4)},
                        {"maximize", false},
                        {"min_lr", jnum(a, "min_lr", 0.0)},
                        {"wd_mult", wd_mult},
                        {"weight_decay", jnum(a, "weight_decay", 0.01) * wd_mult}};
    const int64_t d = pickle_from_json(b, g);
    b.set(d, "betas", b.tuple({b.real(jnum(a, "adam_beta1", 0.9)), b.real(jnum(a, "adam_beta2", 0.999))}));
    groups.push_back(d);
  }
  const int64_t opt = b.dict();
  b.set(opt, "param_groups", b.list(groups));
  // The step, common_step, is added by the caller (a tensor, with its storage).
  b.set(opt, "state", b.dict());
  return opt;
}

}  // namespace

void write_torch_dist(const std::string& save, CheckpointReader& reader) {
  const TrainingState& st = reader.state();
  const int64_t layers = st.args.value("num_layers", int64_t{0});
  if (layers <= 0) fail("cannot write torch_dist: the checkpoint records no num_layers");
  const bool swiglu = st.args.value("swiglu", false);
  const fs::path dir = iteration_dir(save, st.iteration), tmp = dir.string() + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail("cannot create '{}': {}", tmp.string(), ec.message());

  std::vector<Item> items;
  std::map<std::string, bool> used;
  for (const auto& n : reader.names()) used[n] = false;
  Writer w(tmp / "__0_0.distcp");
  // A whole native tensor (or its per-layer copies, stacked) as the chunks of one item.
  auto add_tensor = [&](const std::string& key, const std::vector<std::string>& per_layer) {
    Item it;
    it.name = key;
    const bool stacked = per_layer.size() > 1 || key.rfind(kLayers, 0) == 0;
    for (size_t l = 0; l < per_layer.size(); ++l) {
      const Shape s = reader.shape(per_layer[l]);
      std::vector<float> v = reader.read(per_layer[l]);
      used[per_layer[l]] = true;
      if (l == 0) {
        it.size.assign(s.begin(), s.end());
        if (stacked) it.size.insert(it.size.begin(), static_cast<int64_t>(per_layer.size()));
      }
      // SwiGLU's fc1 is stored as its gate and up halves, as Megatron's sharded factory splits it.
      const bool halves = swiglu && key.find("linear_fc1.weight") != std::string::npos && !s.empty() && s[0] % 2 == 0;
      const int64_t parts = halves ? 2 : 1, rows = s.empty() ? 1 : s[0] / parts;
      const int64_t row_elems = s.empty() ? 1 : shape_numel(s) / s[0];
      for (int64_t p = 0; p < parts; ++p) {
        std::vector<int64_t> off(s.size(), 0), sz(s.begin(), s.end());
        if (!sz.empty()) sz[0] = rows;
        if (!off.empty()) off[0] = p * rows;
        if (stacked) {
          off.insert(off.begin(), static_cast<int64_t>(l));
          sz.insert(sz.begin(), 1);
        }
        // The stored tensor has the chunk's shape (with the layer dimension of 1).
        it.chunks.push_back(w.put(torch_save_tensor(Shape(sz.begin(), sz.end()), v.data() + p * rows * row_elems), off, sz));
      }
    }
    items.push_back(std::move(it));
  };
  auto layer_list = [&](const std::string& prefix, const std::string& suffix) {
    std::vector<std::string> v;
    for (int64_t l = 0; l < layers; ++l) v.push_back(prefix + kLayers + std::to_string(l) + "." + suffix);
    return v;
  };
  auto model_keys = [&](const std::string& prefix, const std::string& key_prefix) {
    for (const auto& n : kPre)
      if (reader.has(prefix + n)) add_tensor(key_prefix + n, {prefix + n});
    for (const auto& [native, meg] : layer_names()) {
      const auto per = layer_list(prefix, native);
      if (!reader.has(per[0])) continue;
      add_tensor(key_prefix + kLayers + meg, per);
    }
    for (const auto& n : kPost)
      if (reader.has(prefix + n)) add_tensor(key_prefix + n, {prefix + n});
  };
  model_keys("", "");
  // Megatron's linears keep a (here empty) _extra_state per layer.
  auto bytes_item = [&](const std::string& name, const std::string& data) {
    Item it;
    it.name = name;
    it.bytes = true;
    it.chunks.push_back(w.put(data, {}, {}));
    items.push_back(std::move(it));
  };
  for (const char* lin : {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"})
    for (int64_t l = 0; l < layers; ++l) {
      Builder b;
      bytes_item(fmt::format("{}{}._extra_state/shard_{}_{}", kLayers, lin, l, layers),
                 torch_save_object(b.pk, b.list({b.none()})));
    }
  const bool optim = st.has_optimizer && reader.has("exp_avg/embedding.word_embeddings.weight");
  if (optim) {
    model_keys("exp_avg/", "optimizer.state.exp_avg.");
    model_keys("exp_avg_sq/", "optimizer.state.exp_avg_sq.");
  }
  for (const auto& [n, u] : used)
    if (!u && (optim || n.find('/') == std::string::npos))
      fail("cannot write torch_dist: tensor '{}' has no place in the layout megatron.cpp writes (MoE experts and "
           "other layers are not written yet)",
           n);

  // The common state: args, iteration, scheduler, optimizer param groups and step.
  const nlohmann::json margs = megatron_args(st);
  {
    Builder b;
    const int64_t d = b.dict();
    b.set(d, "args", b.call(b.global("argparse", "Namespace"), {}, pickle_from_json(b, margs)));
    b.set(d, "checkpoint_version", b.real(3.0));
    b.set(d, "iteration", b.integer(st.iteration));
    b.set(d, "opt_param_scheduler", scheduler(b, st, margs));
    b.set(d, "num_floating_point_operations_so_far", b.real(0.0));
    b.set(d, "content_metadata",
          pickle_from_json(b, {{"chained_optim_avoid_prefix", true}, {"singleton_local_shards", false}}));
    std::vector<std::string> storages;
    if (optim) {
      const int64_t opt = optimizer_common(b, margs);
      const float step = static_cast<float>(st.optimizer_steps);
      const int64_t pid = b.persistent_id(b.tuple({b.str("storage"), b.global("torch", "FloatStorage"), b.str("0"),
                                                   b.str("cpu"), b.integer(1)}));
      const int64_t t = b.call(b.global("torch._utils", "_rebuild_tensor_v2"),
                               {pid, b.integer(0), b.tuple({}), b.tuple({}), b.boolean(false),
                                b.call(b.global("collections", "OrderedDict"), {})});
      b.set(b.pk.get(opt, "state"), "common_step", t);
      b.set(d, "optimizer", opt);
      storages.push_back(std::string(reinterpret_cast<const char*>(&step), 4));
    }
    bytes_item("common_state/shard_0_1", torch_save_archive(pickle::serialize(b.pk, b.list({d})), storages));
  }
  {  // The rerun state machine's state, as a fresh Megatron run saves it.
    Builder b;
    const int64_t d = pickle_from_json(b, {{"checkpoint_requested", false},
                                    {"continue_requested", false},
                                    {"data_iterator_checkpoints", nullptr},
                                    {"failed_validation_call", nullptr},
                                    {"initial_result", nullptr},
                                    {"large_value_counts", nlohmann::json::object()},
                                    {"max_values", nlohmann::json::object()},
                                    {"rerun_requested", false},
                                    {"restart_again_requested", false},
                                    {"suspicious_device", nullptr},
                                    {"suspicious_node", nullptr}});
    const int64_t inj = pickle_from_json(b, {{"error_injection_rate", 0}, {"injected_error_type", nullptr}});
    b.set(inj, "error_injection_type",
          b.call(b.global("megatron.core.rerun_state_machine", "RerunDiagnostic"), {b.str("transient_error")}));
    b.set(d, "error_injector_checkpoint", inj);
    bytes_item("rerun_state_machine_state/shard_0_1", torch_save_object(b.pk, b.list({d})));
  }
  w.close();

  // .metadata: every item's type, size and chunks, and where each lies in __0_0.distcp.
  Builder b;
  const int64_t sdm = b.dict(), sd = b.dict();
  for (const auto& it : items) {
    const int64_t key = b.str(it.name);
    if (it.bytes) {
      b.pk.nodes[static_cast<size_t>(sdm)].items.push_back(key);
      b.pk.nodes[static_cast<size_t>(sdm)].items.push_back(b.call(b.global(kMd, "BytesStorageMetadata"), {}, -1, true));
    } else {
      const int64_t props = b.call(
          b.global(kMd, "TensorProperties"), {},
          b.tuple({b.global("torch", "float32"),
                   b.call(b.global("torch.serialization", "_get_layout"), {b.str("torch.strided")}), b.boolean(false),
                   b.call(b.global(kMd, "_MEM_FORMAT_ENCODING"), {b.integer(0)}), b.boolean(false)}),
          true);
      std::vector<int64_t> chunks;
      for (const auto& c : it.chunks) {
        const int64_t cs = b.dict();
        b.set(cs, "offsets", size_of(b, c.offsets));
        b.set(cs, "sizes", size_of(b, c.sizes));
        chunks.push_back(b.call(b.global(kMd, "ChunkStorageMetadata"), {}, cs, true));
      }
      const int64_t ts = b.dict();
      b.set(ts, "properties", props);
      b.set(ts, "size", size_of(b, it.size));
      b.set(ts, "chunks", b.list(chunks));
      b.pk.nodes[static_cast<size_t>(sdm)].items.push_back(key);
      b.pk.nodes[static_cast<size_t>(sdm)].items.push_back(b.call(b.global(kMd, "TensorStorageMetadata"), {}, ts, true));
    }
    for (const auto& c : it.chunks) {
      const int64_t mi = b.dict();
      b.set(mi, "fqn", b.str(it.name));
      if (!it.bytes) b.set(mi, "offset", size_of(b, c.offsets));
      b.set(mi, "index", b.none());
      const int64_t si = b.dict();
      b.set(si, "relative_path", b.str("__0_0.distcp"));
      b.set(si, "offset", b.integer(static_cast<int64_t>(c.offset)));
      b.set(si, "length", b.integer(static_cast<int64_t>(c.length)));
      b.pk.nodes[static_cast<size_t>(sd)].items.push_back(b.call(b.global(kMd, "MetadataIndex"), {}, mi, true));
      b.pk.nodes[static_cast<size_t>(sd)].items.push_back(
          b.call(b.global("torch.distributed.checkpoint.filesystem", "_StorageInfo"), {}, si, true));
    }
  }
  const int64_t top = b.dict();
  b.set(top, "state_dict_metadata", sdm);
  b.set(top, "planner_data", b.none());
  b.set(top, "storage_data", sd);
  b.set(top, "storage_meta", b.none());
  b.set(top, "version", b.str("1.0.0"));
  const std::string md = pickle::serialize(b.pk, b.call(b.global(kMd, "Metadata"), {}, top, true));
  {
    NewFile f(tmp / ".metadata");
    f.write(md.data(), md.size());
    f.sync_and_close();
  }
  write_text_durable(tmp / "metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  fsync_path(tmp);
  fs::remove_all(dir, ec);  // saving an iteration again replaces it, as in Megatron-LM
  fs::rename(tmp, dir, ec);
  if (ec) fail("cannot move '{}' into place: {}", tmp.string(), ec.message());
  write_text_durable(fs::path(save) / "latest_checkpointed_iteration.txt", std::to_string(st.iteration));
}

}  // namespace mt::checkpoint::megatron
