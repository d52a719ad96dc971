// Megatron-LM torch_dist and torch checkpoints as native tensors and state (megatron_import.h).
#include "checkpoint/megatron/megatron_import.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "checkpoint/megatron/dcp.h"
#include "checkpoint/metadata.h"
#include "core/dtype.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace mt::checkpoint::megatron {

using pickle::Kind;
using pickle::Pickle;

Format detect_format(const std::string& iter_dir) {
  const fs::path d(iter_dir);
  std::error_code ec;
  if (fs::exists(d / ".metadata", ec)) return Format::TorchDist;
  if (fs::exists(d / "mp_rank_00", ec) || fs::exists(d / "mp_rank_00_000", ec)) return Format::Torch;
  return Format::None;
}

const char* format_name(Format f) { return f == Format::TorchDist ? "torch_dist" : f == Format::Torch ? "torch" : "native"; }

namespace {

// A pickled value as JSON, for the args Namespace: plain values and containers; objects
// (enums, dtypes) become null, as nothing megatron.cpp restores is one.
nlohmann::json to_json(const Pickle& pk, int64_t n) {
  const pickle::Node& v = pk.at(n);
  switch (v.kind) {
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i;
    case Kind::Float: return std::isfinite(v.f) ? nlohmann::json(v.f) : nlohmann::json();
    case Kind::Str: return v.s;
    case Kind::Tuple:
    case Kind::List: {
      nlohmann::json a = nlohmann::json::array();
      for (int64_t c : v.items) a.push_back(to_json(pk, c));
      return a;
    }
    case Kind::Dict: {
      nlohmann::json o = nlohmann::json::object();
      for (size_t k = 0; k + 1 < v.items.size(); k += 2)
        if (pk.at(v.items[k]).kind == Kind::Str) o[pk.at(v.items[k]).s] = to_json(pk, v.items[k + 1]);
      return o;
    }
    case Kind::Call:
      if (pk.callee(n) == "argparse.Namespace" && v.items[2] >= 0) return to_json(pk, v.items[2]);
      return nullptr;
    default: return nullptr;
  }
}

// Bytes items of a distributed checkpoint are saved wrapped in a one-element list.
int64_t unwrap(const Pickle& pk, int64_t n) {
  while (pk.at(n).kind == Kind::List && pk.at(n).items.size() == 1) n = pk.at(n).items[0];
  return n;
}

int64_t need(const Pickle& pk, int64_t dict, const std::string& key, const std::string& where) {
  const int64_t v = pk.get(dict, key);
  if (v < 0) fail("'{}' is not a Megatron-LM checkpoint megatron.cpp reads: it has no '{}'", where, key);
  return v;
}

int64_t json_count(const nlohmann::json& a, const char* key, const std::string& where) {
  auto it = a.find(key);
  if (it == a.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxSamples)
    fail("'{}': args.{} is not a valid count", where, key);
  return it->get<int64_t>();
}

template <typename T>
T arg(const nlohmann::json& a, const char* key, T dflt) {
  auto it = a.find(key);
  if (it == a.end() || it->is_null()) return dflt;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return dflt;
  }
}

// The native model args (checkpoint/model_args.h) of a Megatron run's args.
nlohmann::json native_model_args(const nlohmann::json& a, const std::string& where) {
  for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size"})
    if (!a.contains(k) || !a[k].is_number_integer())
      fail("'{}': the checkpoint's args lack {} (not a Megatron-LM GPT checkpoint?)", where, k);
  const int64_t heads = a["num_attention_heads"], hidden = a["hidden_size"];
  const bool gqa = arg(a, "group_query_attention", false);
  const std::string tok = arg<std::string>(a, "tokenizer_type", "NullTokenizer");
  const int64_t vocab_arg = arg<int64_t>(a, "vocab_size", 0);
  const int64_t padded = a["padded_vocab_size"];
  // The tokenizer's vocabulary: NullTokenizer adds EOD to --vocab-size; others are not recorded.
  const int64_t orig = tok == "NullTokenizer" && vocab_arg > 0 ? vocab_arg + 1 : padded;
  nlohmann::json j = {
      {"num_layers", a["num_layers"]},
      {"hidden_size", hidden},
      {"ffn_hidden_size", arg<int64_t>(a, "ffn_hidden_size", 4 * hidden)},
      {"num_attention_heads", heads},
      {"num_query_groups", gqa ? arg<int64_t>(a, "num_query_groups", heads) : heads},
      {"kv_channels", arg<int64_t>(a, "kv_channels", heads > 0 ? hidden / heads : 0)},
      {"seq_length", a["seq_length"]},
      {"max_position_embeddings", arg<int64_t>(a, "max_position_embeddings", a["seq_length"])},
      {"vocab_size", padded},
      {"orig_vocab_size", orig},
      {"normalization", arg<std::string>(a, "normalization", "LayerNorm")},
      {"norm_epsilon", arg<double>(a, "norm_epsilon", 1e-5)},
      {"swiglu", arg(a, "swiglu", false)},
      {"openai_gelu", arg(a, "openai_gelu", false)},
      {"position_embedding_type", arg<std::string>(a, "position_embedding_type", "learned_absolute")},
      {"rotary_base", arg<double>(a, "rotary_base", 10000)},
      {"rotary_percent", arg<double>(a, "rotary_percent", 1.0)},
      {"qk_layernorm", arg(a, "qk_layernorm", false)},
      {"add_bias_linear", arg(a, "add_bias_linear", true)},
      {"add_qkv_bias", arg(a, "add_qkv_bias", false)},
      {"untie_embeddings_and_output_weights", arg(a, "untie_embeddings_and_output_weights", false)},
      {"bf16", arg(a, "bf16", false)},
      {"fp16", arg(a, "fp16", false)},
      {"tokenizer_type", tok},
      {"vocab_file", arg<std::string>(a, "vocab_file", "")},
      {"merge_file", arg<std::string>(a, "merge_file", "")},
      {"tokenizer_model", arg<std::string>(a, "tokenizer_model", "")},
      {"tokenizer_vocab_size", vocab_arg}};
  return j;
}

// The training state and args from the common dict both formats share.
TrainingState common_state(const Pickle& pk, int64_t d, const std::string& where, int64_t iteration) {
  if (pk.at(d).kind != Kind::Dict) fail("'{}' is not a Megatron-LM checkpoint: its state is not a dict", where);
  TrainingState st;
  const int64_t ver = pk.get(d, "checkpoint_version");
  const double version = ver >= 0 && pk.at(ver).kind == Kind::Float ? pk.at(ver).f
                         : ver >= 0 && pk.at(ver).kind == Kind::Int ? static_cast<double>(pk.at(ver).i) : 0;
  if (version < 3)
    fail("'{}' is a Megatron-LM checkpoint of version {} (before 3.0, another QKV layout); megatron.cpp reads "
         "version 3 and later: re-save it with a current Megatron-LM",
         where, version);
  const pickle::Node& it = pk.at(need(pk, d, "iteration", where));
  if (it.kind != Kind::Int || it.i < 0 || it.i > kMaxIteration) fail("'{}': iteration is not a valid number", where);
  if (iteration != kReleaseIteration && it.i != iteration)
    fail("'{}' holds iteration {}, but the tracker and directory name say {}", where, it.i, iteration);
  st.iteration = it.i;
  const nlohmann::json margs = to_json(pk, need(pk, d, "args", where));
  if (!margs.is_object()) fail("'{}': args is not an argparse.Namespace", where);
  st.consumed_train_samples = json_count(margs, "consumed_train_samples", where);
  st.consumed_valid_samples = json_count(margs, "consumed_valid_samples", where);
  const int64_t sched = pk.get(d, "opt_param_scheduler");
  nlohmann::json sched_json;
  if (sched >= 0) {
    sched_json = to_json(pk, sched);
    const int64_t steps = pk.get(sched, "num_steps");
    if (steps >= 0 && pk.at(steps).kind == Kind::Int && pk.at(steps).i >= 0 && pk.at(steps).i <= kMaxSamples)
      st.scheduler_samples = pk.at(steps).i;
  } else {
    st.scheduler_samples = st.consumed_train_samples;
  }
  st.args = native_model_args(margs, where);
  // For --use-checkpoint-args: Megatron's arg names are megatron.cpp's flag names. A dense run's
  // MoE settings are Megatron's defaults, which are no settings at all here.
  nlohmann::json run = margs;
  if (arg<int64_t>(margs, "num_experts", 0) == 0)
    for (auto it = run.begin(); it != run.end();) it = it.key().rfind("moe_", 0) == 0 ? run.erase(it) : std::next(it);
  // Switches whose destination Megatron names by what they turn off.
  run["disable_bias_linear"] = !arg(margs, "add_bias_linear", true);
  run["no_position_embedding"] = !arg(margs, "add_position_embedding", true);
  st.args["run_args"] = {{"arguments", run}};
  st.args["megatron_checkpoint_version"] = version;
  if (sched_json.is_object()) st.args["megatron_opt_param_scheduler"] = sched_json;  // for writing torch_dist back
  return st;
}

// Megatron's names for the layer norms fused into the following linear (Transformer Engine).
std::string native_layer_suffix(const std::string& s) {
  if (s == "self_attention.linear_qkv.layer_norm_weight") return "input_layernorm.weight";
  if (s == "self_attention.linear_qkv.layer_norm_bias") return "input_layernorm.bias";
  if (s == "mlp.linear_fc1.layer_norm_weight") return "pre_mlp_layernorm.weight";
  if (s == "mlp.linear_fc1.layer_norm_bias") return "pre_mlp_layernorm.bias";
  return s;
}

const std::string kLayers = "decoder.layers.";

// A legacy name (decoder.layers.3.x) in native form.
std::string native_name(const std::string& n) {
  if (n.rfind(kLayers, 0) != 0) return n;
  const size_t dot = n.find('.', kLayers.size());
  if (dot == std::string::npos) return n;
  return n.substr(0, dot + 1) + native_layer_suffix(n.substr(dot + 1));
}

struct ParamInfo {
  std::string name;
  Shape shape;
};

// Splits a layer-stacked tensor [layers, ...] of `stacked` (decoder.layers.<suffix>) into per-layer
// native tensors under `prefix` (e.g. "exp_avg/"), recording them in order per layer.
void split_layers(const std::string& prefix, const std::string& suffix, HostTensor t, Imported& out,
                  std::vector<std::vector<ParamInfo>>* per_layer, const std::string& where) {
  if (t.shape.empty()) fail("'{}': layer-stacked tensor decoder.layers.{} has no layer dimension", where, suffix);
  const int64_t layers = t.shape[0];
  const Shape one(t.shape.begin() + 1, t.shape.end());
  const int64_t n = shape_numel(one);
  if (per_layer && per_layer->size() < static_cast<size_t>(layers)) per_layer->resize(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) {
    const std::string name = kLayers + std::to_string(l) + "." + native_layer_suffix(suffix);
    HostTensor h;
    h.shape = one;
    h.values.assign(t.values.begin() + l * n, t.values.begin() + (l + 1) * n);
    if (per_layer) (*per_layer)[static_cast<size_t>(l)].push_back({name, one});
    out.tensors[prefix + name] = std::move(h);
  }
}

// --- torch_dist ---

const std::string kDistOpt = "optimizer.distributed.";

// The distributed optimizer's flat buffers cut into parameters: Megatron's gradient buffer holds
// the parameters in reverse registration order, each start padded to a multiple of 64 elements,
// split into buckets; the checkpoint stores each bucket's main params and Adam moments flat.
void read_distopt(DcpReader& r, const std::vector<ParamInfo>& order, Imported& out, const std::string& where) {
  std::map<int64_t, std::string> buckets;  // bucket index -> key prefix
  for (const auto& name : r.metadata().order) {
    if (name.rfind(kDistOpt, 0) != 0) continue;
    const std::string tail = ".param";
    if (name.size() < tail.size() || name.compare(name.size() - tail.size(), tail.size(), tail) != 0) continue;
    if (name.find("dp_group_idx_0.gbuf_idx_0.") == std::string::npos)
      fail("'{}': distributed-optimizer state '{}' is in a second buffer (expert or mixed-dtype parameters), which "
           "megatron.cpp does not read yet; use --no-load-optim to load the weights only",
           where, name);
    const size_t b = name.rfind(".bucket_idx_");
    const std::string num = name.substr(b + 12, name.size() - tail.size() - b - 12);
    int64_t idx = -1;
    try {
      idx = std::stoll(num);
    } catch (...) {
    }
    if (idx < 0 || idx > 1'000'000) fail("'{}': cannot read the bucket of '{}'", where, name);
    buckets[idx] = name.substr(0, name.size() - tail.size());
  }
  if (buckets.empty()) fail("'{}': the distributed optimizer's state has no parameter buffer", where);
  if (static_cast<int64_t>(buckets.size()) != buckets.rbegin()->first + 1)
    fail("'{}': the distributed optimizer's buckets are not numbered 0..{}", where, buckets.size() - 1);
  size_t p = order.size();  // walk the parameters in reverse
  for (const auto& [b, key] : buckets) {
    HostTensor main = r.read(key + ".param"), m = r.read(key + ".exp_avg"), v = r.read(key + ".exp_avg_sq");
    if (main.shape.size() != 1 || m.shape != main.shape || v.shape != main.shape)
      fail("'{}': distributed-optimizer bucket {} has buffers of different shapes", where, b);
    const int64_t size = main.shape[0];
    int64_t cursor = 0;
    // A bucket ends with the parameter that reaches its unpadded end; the last bucket takes the rest.
    while (p > 0) {
      const ParamInfo& pi = order[p - 1];
      const int64_t start = (cursor + 63) / 64 * 64, n = shape_numel(pi.shape);
      if (start + n > size) break;
      for (auto [prefix, buf] : {std::pair<const char*, HostTensor*>{"", &main}, {"exp_avg/", &m}, {"exp_avg_sq/", &v}}) {
        HostTensor h;
        h.shape = pi.shape;
        h.values.assign(buf->values.begin() + start, buf->values.begin() + start + n);
        if (prefix[0] == '\0') {
          // The main params must round to the checkpoint's own model weights: this checks the
          // order and offsets assumed above.
          auto it = out.tensors.find(pi.name);
          if (it == out.tensors.end() || it->second.values.size() != h.values.size())
            fail("'{}': no model weight '{}' to match the distributed optimizer's buffer", where, pi.name);
          for (size_t k = 0; k < h.values.size(); ++k) {
            const float w = it->second.values[k], x = h.values[k];
            if (w != x && w != round_bf16(x) && w != f16_to_f32(f32_to_f16(x)))
              fail("'{}': the distributed optimizer's buffer does not line up with the model weights at '{}' (a "
                   "parameter order megatron.cpp does not know, e.g. --transformer-impl transformer_engine); use "
                   "--no-load-optim to load the weights only",
                   where, pi.name);
          }
          it->second.values = std::move(h.values);  // the fp32 main params are the weights
        } else {
          out.tensors[prefix + pi.name] = std::move(h);
        }
      }
      cursor = start + n;
      --p;
    }
  }
  if (p != 0)
    fail("'{}': the distributed optimizer's buffers hold fewer elements than the model's parameters", where);
}

Imported read_torch_dist(const std::string& dir, int64_t iteration, bool weights) {
  DcpReader r(dir);
  const std::string cname = r.find_object("common_state");
  TorchSave common = r.object(cname);
  const Pickle& cp = common.pickle();
  const int64_t d = unwrap(cp, cp.root);
  Imported out;
  out.state = common_state(cp, d, common.where(), iteration);
  const bool distopt = std::any_of(r.metadata().order.begin(), r.metadata().order.end(),
                                   [](const std::string& n) { return n.rfind(kDistOpt, 0) == 0; });
  const bool has_moments = distopt || std::any_of(r.metadata().order.begin(), r.metadata().order.end(), [](const std::string& n) {
                             return n.rfind("optimizer.state.exp_avg.", 0) == 0;
                           });
  // The optimizer's step count: the plain optimizer's common_step, or the distributed one's
  // param_groups[0].step (in its own bytes item).
  auto step_of_groups = [&](const TorchSave& ts, int64_t opt) {
    const Pickle& pk = ts.pickle();
    const int64_t groups = pk.get(opt, "param_groups");
    if (groups < 0 || pk.at(groups).kind != Kind::List || pk.at(groups).items.empty()) return int64_t{-1};
    const int64_t step = pk.get(pk.at(groups).items[0], "step");
    return step < 0 ? int64_t{-1} : static_cast<int64_t>(ts.number(step, "the optimizer step"));
  };
  int64_t steps = -1;
  if (const int64_t opt = cp.get(d, "optimizer"); opt >= 0 && cp.at(opt).kind == Kind::Dict) {
    if (const int64_t s = cp.get(opt, "state"); s >= 0)
      if (const int64_t cs = cp.get(s, "common_step"); cs >= 0) steps = static_cast<int64_t>(common.number(cs, "common_step"));
    if (steps < 0) steps = step_of_groups(common, opt);
  }
  if (distopt && steps < 0) {
    for (const auto& [name, range] : r.metadata().bytes)
      if (name.rfind(kDistOpt, 0) == 0 && name.find(".optimizer/") != std::string::npos) {
        TorchSave ts = r.object(name);
        steps = step_of_groups(ts, unwrap(ts.pickle(), ts.pickle().root));
      }
  }
  out.state.has_optimizer = has_moments;
  if (has_moments && steps < 0) fail("'{}': the optimizer state has no step count", dir);
  out.state.optimizer_steps = std::max<int64_t>(steps, 0);
  if (!weights) return out;
  // The model's parameters in Megatron's registration order: those before the layers, then each
  // layer's, then those after (the metadata lists them in module order).
  std::vector<ParamInfo> pre, post;
  std::vector<std::vector<ParamInfo>> layers;
  for (const auto& name : r.metadata().order) {
    if (name.rfind("optimizer.", 0) == 0) {
      const std::string s = "optimizer.state.";
      if (name.rfind(s, 0) != 0) continue;
      const std::string rest = name.substr(s.size());
      const size_t dot = rest.find('.');
      const std::string state = rest.substr(0, dot), param = rest.substr(dot + 1);
      if (state != "exp_avg" && state != "exp_avg_sq") continue;  // fp32 main params follow below
      if (param.rfind(kLayers, 0) == 0) split_layers(state + "/", param.substr(kLayers.size()), r.read(name), out, nullptr, dir);
      else out.tensors[state + "/" + param] = r.read(name);
      continue;
    }
    if (name.rfind(kLayers, 0) == 0) {
      split_layers("", name.substr(kLayers.size()), r.read(name), out, &layers, dir);
      continue;
    }
    HostTensor t = r.read(name);
    (layers.empty() ? pre : post).push_back({name, t.shape});
    out.tensors[name] = std::move(t);
  }
  // The plain optimizer with mixed precision keeps fp32 main params beside the moments.
  for (const auto& name : r.metadata().order) {
    const std::string s = "optimizer.state.fp32_param.";
    if (name.rfind(s, 0) != 0) continue;
    const std::string param = name.substr(s.size());
    if (param.rfind(kLayers, 0) == 0) split_layers("", param.substr(kLayers.size()), r.read(name), out, nullptr, dir);
    else out.tensors[param] = r.read(name);
  }
  if (distopt) {
    std::vector<ParamInfo> order = pre;
    for (const auto& l : layers) order.insert(order.end(), l.begin(), l.end());
    order.insert(order.end(), post.begin(), post.end());
    read_distopt(r, order, out, dir);
  }
  return out;
}

// --- legacy torch ---

Imported read_torch(const std::string& dir, int64_t iteration, bool weights) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("mp_rank_", 0) == 0 && n != "mp_rank_00")
      fail("'{}' is a --ckpt-format torch checkpoint saved with tensor or pipeline parallelism ({}); megatron.cpp "
           "reads single-rank legacy checkpoints: save it with Megatron-LM as torch_dist (--ckpt-format torch_dist "
           "--ckpt-convert-format torch_dist) and load that",
           dir, n);
    if (n == "distrib_optim.pt") fail("'{}': the legacy distributed optimizer's distrib_optim.pt is not read; use --no-load-optim", dir);
  }
  const std::string path = (fs::path(dir) / "mp_rank_00" / "model_optim_rng.pt").string();
  MappedFile f(path, "--load (Megatron-LM torch checkpoint)");
  TorchSave ts(Bytes{f.data(), f.size()}, path);
  const Pickle& pk = ts.pickle();
  const int64_t d = pk.root;
  Imported out;
  out.state = common_state(pk, d, path, iteration);
  if (const int64_t o = pk.get(d, "optimizer"); o >= 0) {
    const int64_t inner = pk.get(o, "optimizer");
    const int64_t st = pk.get(inner >= 0 ? inner : o, "state");
    out.state.has_optimizer = st >= 0 && pk.at(st).kind == Kind::Dict && !pk.at(st).items.empty();
    // Every parameter's state holds the same step; the first one's is the optimizer's.
    if (out.state.has_optimizer) {
      const int64_t step = pk.get(pk.at(st).items[1], "step");
      if (step < 0) fail("'{}': the optimizer state has no step count", path);
      out.state.optimizer_steps = static_cast<int64_t>(ts.number(step, "the optimizer step"));
    }
  }
  if (!weights) return out;
  const int64_t model = need(pk, d, "model", path);
  if (pk.at(model).kind != Kind::Dict) fail("'{}': model is not a state dict", path);
  std::vector<ParamInfo> order;
  const auto& items = pk.at(model).items;
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    if (pk.at(items[k]).kind != Kind::Str) fail("'{}': a model key is not a string", path);
    const std::string name = pk.at(items[k]).s;
    if (!ts.is_tensor(items[k + 1])) continue;  // _extra_state and other objects
    HostTensor t = ts.tensor(items[k + 1], name);
    order.push_back({native_name(name), t.shape});
    out.tensors[native_name(name)] = std::move(t);
  }
  int64_t opt = pk.get(d, "optimizer");
  if (opt < 0) return out;
  // Mixed precision wraps torch's optimizer state and keeps the fp32 main params beside it.
  int64_t fp32 = -1;
  if (const int64_t inner = pk.get(opt, "optimizer"); inner >= 0) {
    fp32 = pk.get(opt, "fp32_from_fp16_params");
    opt = inner;
  }
  const int64_t groups = need(pk, opt, "param_groups", path), state = need(pk, opt, "state", path);
  if (pk.at(groups).kind != Kind::List) fail("'{}': optimizer param_groups is not a list", path);
  // Megatron's groups: parameters with weight decay (matrices) and without (biases and 1-D norms),
  // each in registration order; torch numbers them across the groups in turn.
  std::vector<ParamInfo> wd, no_wd;
  for (const auto& p : order) {
    const bool plain = p.shape.size() <= 1 || (p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0);
    (plain ? no_wd : wd).push_back(p);
  }
  size_t next_wd = 0, next_no = 0;
  for (size_t g = 0; g < pk.at(groups).items.size(); ++g) {
    const int64_t grp = pk.at(groups).items[g];
    const int64_t wdm = pk.get(grp, "wd_mult"), wdv = pk.get(grp, "weight_decay");
    const int64_t key = wdm >= 0 ? wdm : wdv;
    const bool zero = key >= 0 && ts.number(key, "weight_decay") == 0.0;
    const int64_t ids = need(pk, grp, "params", path);
    if (pk.at(ids).kind != Kind::List) fail("'{}': optimizer params is not a list", path);
    for (size_t j = 0; j < pk.at(ids).items.size(); ++j) {
      auto& list = zero ? no_wd : wd;
      size_t& next = zero ? next_no : next_wd;
      if (next >= list.size())
        fail("'{}': the optimizer's parameter groups do not match the model's parameters", path);
      const ParamInfo& pi = list[next++];
      const int64_t id = pk.at(ids).items[j];
      int64_t ps = -1;
      const auto& st_items = pk.at(state).items;
      for (size_t q = 0; q + 1 < st_items.size(); q += 2)
        if (pk.at(st_items[q]).kind == Kind::Int && pk.at(id).kind == Kind::Int && pk.at(st_items[q]).i == pk.at(id).i)
          ps = st_items[q + 1];
      if (ps < 0) continue;  // a parameter that never took a step
      for (const char* s : {"exp_avg", "exp_avg_sq"}) {
        HostTensor t = ts.tensor(need(pk, ps, s, path), std::string(s) + " of " + pi.name);
        if (t.shape != pi.shape)
          fail("'{}': the optimizer's {} for '{}' has shape {}, the parameter {}", path, s, pi.name,
               shape_to_string(t.shape), shape_to_string(pi.shape));
        out.tensors[std::string(s) + "/" + pi.name] = std::move(t);
      }
      // fp32 main params: fp32_from_fp16_params[group][j].
      if (fp32 >= 0 && pk.at(fp32).kind == Kind::List && g < pk.at(fp32).items.size()) {
        const pickle::Node& gl = pk.at(pk.at(fp32).items[g]);
        if (gl.kind == Kind::List && j < gl.items.size()) {
          HostTensor t = ts.tensor(gl.items[j], "fp32 main param of " + pi.name);
          if (t.shape != pi.shape) fail("'{}': the fp32 main param of '{}' has another shape", path, pi.name);
          out.tensors[pi.name] = std::move(t);
        }
      }
    }
  }
  if (next_wd != wd.size() || next_no != no_wd.size())
    fail("'{}': the optimizer's parameter groups do not match the model's parameters", path);
  return out;
}

}  // namespace

Imported read_checkpoint(const std::string& iter_dir, int64_t iteration, bool weights) {
  switch (detect_format(iter_dir)) {
    case Format::TorchDist: return read_torch_dist(iter_dir, iteration, weights);
    case Format::Torch: return read_torch(iter_dir, iteration, weights);
    default: fail("'{}' is not a Megatron-LM checkpoint (no .metadata, no mp_rank_00)", iter_dir);
  }
}

}  // namespace mt::checkpoint::megatron
