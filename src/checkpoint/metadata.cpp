#include "checkpoint/metadata.h"

#include "checkpoint/io_util.h"
#include "checkpoint/json_fields.h"
#include "checkpoint/model_bounds.h"
#include "checkpoint/tokenizer_files.h"
#include "core/checked.h"
#include "core/error.h"

namespace mt::checkpoint {

namespace {

constexpr int64_t kMaxRanks = 1 << 24;

std::map<std::string, FileInfo> parse_files(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: files must be an object, got {}", where, json_brief(j));
  std::map<std::string, FileInfo> out;
  for (auto& [name, f] : j.items()) {
    // Only names inside the iteration directory: an absolute or ../ name would read elsewhere.
    if (!is_plain_file_name(name) && !is_asset_name(name))
      fail("{}: file name '{}' points outside the checkpoint directory", where, name.substr(0, 200));
    const std::string what = where + ": files." + name;
    if (f.is_number()) {  // version 1: the CRC only
      out[name] = {static_cast<uint32_t>(json_uint(f, what, UINT32_MAX)), -1};
      continue;
    }
    JsonFields ff(f, what);
    out[name] = {static_cast<uint32_t>(json_uint(ff.at("crc32"), ff.what("crc32"), UINT32_MAX)),
                 ff.integer("bytes", 0, INT64_MAX)};
  }
  return out;
}

// One stored piece: its box must lie inside the tensor (same rank) and its flat range inside the box.
Piece parse_piece(const nlohmann::json& j, const std::string& what, const Shape& shape,
                  const std::map<std::string, FileInfo>& files) {
  JsonFields f(j, what);
  Piece pc;
  pc.file = json_string(f.at("file"), f.what("file"));
  if (!files.count(pc.file))
    fail("{} is in file '{}', which the checkpoint's files do not list", what, pc.file.substr(0, 200));
  pc.key = json_string(f.at("key"), f.what("key"));
  const int64_t rank = static_cast<int64_t>(shape.size());
  pc.box.offset = json_int_array(f.at("offset"), f.what("offset"), 0, INT64_MAX, rank);
  pc.box.extent = json_int_array(f.at("extent"), f.what("extent"), 0, INT64_MAX, rank);
  for (size_t d = 0; d < shape.size(); ++d)
    if (checked_add(pc.box.offset[d], pc.box.extent[d], what) > shape[d])
      fail("{}: box offset {} extent {} reaches past the tensor's dimension {} of {}", what, pc.box.offset[d],
           pc.box.extent[d], d, shape[d]);
  const int64_t numel = checked_product(pc.box.extent, what);
  const std::vector<int64_t> flat = json_int_array(f.at("flat"), f.what("flat"), 0, numel, 2);
  if (flat[0] > flat[1]) fail("{}: flat range [{}, {}] is reversed", what, flat[0], flat[1]);
  pc.flat_lo = flat[0];
  pc.flat_hi = flat[1];
  return pc;
}

// The MoE arguments (absent in dense checkpoints): sizes within bounds, types as written. The
// rules between them are TransformerConfig::finalize's, when the model is built.
void check_moe_args(const JsonFields& a, int64_t layers) {
  const int64_t experts = a.integer_or("num_experts", 0, 0, kMaxExperts);
  if (experts == 0) return;
  a.integer_or("moe_ffn_hidden_size", 0, 0, kMaxFfn);
  a.integer_or("moe_shared_expert_intermediate_size", 0, 0, kMaxFfn);
  a.integer_or("moe_router_topk", 1, 1, experts);
  a.integer_or("moe_router_num_groups", 0, 0, experts);
  a.integer_or("moe_router_group_topk", 0, 0, experts);
  if (a.has("moe_layer_freq")) {
    const auto& f = a.at("moe_layer_freq");
    if (f.is_array()) json_int_array(f, a.what("moe_layer_freq"), 0, 1, layers);
    else json_int(f, a.what("moe_layer_freq"), 1, layers);
  }
  for (const char* k : {"moe_router_topk_scaling_factor", "moe_aux_loss_coeff", "moe_z_loss_coeff",
                        "moe_router_bias_update_rate"})
    a.number_or(k, 0, 0, 1e15);
  a.number_or("moe_expert_capacity_factor", 0, -1e15, 1e15);
  for (const char* k : {"moe_router_pre_softmax", "moe_router_enable_expert_bias", "moe_shared_expert_gate",
                        "moe_pad_expert_input_to_capacity", "moe_grouped_gemm", "moe_permute_fusion"})
    a.boolean_or(k, false);
  for (const char* k : {"moe_router_score_function", "moe_router_dtype", "moe_router_load_balancing_type",
                        "moe_token_drop_policy", "moe_token_dispatcher_type"})
    a.string_or(k, "");
}

// The model arguments the checkpoint was saved with (generate, logits and convert build the model
// from them): sizes within the bounds a HF config has, flags and names of their JSON types. Keys
// added in later versions may be absent.
void check_model_args(const JsonFields& a) {
  const int64_t heads = a.integer("num_attention_heads", 1, kMaxHeads);
  const int64_t layers = a.integer("num_layers", 1, kMaxLayers);
  a.integer("hidden_size", 1, kMaxHidden);
  a.integer("ffn_hidden_size", 1, kMaxFfn);
  const int64_t groups = a.integer("num_query_groups", 1, heads);
  if (heads % groups != 0)
    fail("{}: num_attention_heads ({}) must be divisible by num_query_groups ({})", a.where(), heads, groups);
  a.integer("kv_channels", 1, kMaxHeadDim);
  a.integer("seq_length", 1, kMaxPositions);
  a.integer("max_position_embeddings", 0, kMaxPositions);
  const int64_t vocab = a.integer("vocab_size", 1, kMaxVocab);
  a.integer("orig_vocab_size", 1, vocab);
  a.integer("tokenizer_vocab_size", 0, kMaxVocab);
  a.integer_or("rope_original_max_position", 8192, 1, kMaxPositions);
  a.integer_or("tiktoken_num_special_tokens", 1000, 1, kMaxVocab);
  a.string_or("tiktoken_pattern", "");
  for (const char* k : {"norm_epsilon", "rotary_base"})
    if (json_number(a.at(k), a.what(k), 0, 1e15) <= 0) fail("{} must be positive", a.what(k));
  if (json_number(a.at("rotary_percent"), a.what("rotary_percent"), 0, 1) <= 0)
    fail("{} must be positive", a.what("rotary_percent"));
  for (const char* k : {"rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor"})
    if (a.number_or(k, 1.0, 0, 1e6) <= 0) fail("{} must be positive", a.what(k));
  for (const char* k : {"swiglu", "openai_gelu", "add_bias_linear", "add_qkv_bias",
                        "untie_embeddings_and_output_weights", "bf16"})
    a.boolean(k);
  for (const char* k : {"rope_scaling", "qk_layernorm", "fp16", "layernorm_zero_centered_gamma"}) a.boolean_or(k, false);
  for (const char* k : {"normalization", "position_embedding_type", "tokenizer_type", "vocab_file", "merge_file",
                        "tokenizer_model"})
    json_string(a.at(k), a.what(k));
  check_moe_args(a, layers);
}

}  // namespace

Metadata parse_metadata(const nlohmann::json& j, const std::string& where) {
  JsonFields m(j, fmt::format("'{}'", where));
  const std::string w = m.where();
  if (m.string_or("format", "") != "megatron.cpp-native")
    fail("{} is not a megatron.cpp checkpoint (format {})", w, m.has("format") ? json_brief(m.at("format")) : "missing");
  Metadata md;
  md.version = m.integer("version", 1, INT64_MAX);
  if (md.version > 2)
    fail("{} is format version {}, newer than this megatron.cpp reads (2); update megatron.cpp", w, md.version);
  md.files = parse_files(m.at("files"), w);
  if (m.has("layout")) {
    JsonFields l(m.at("layout"), w + ": layout");
    md.tp = l.integer_or("tp", 1, 1, kMaxRanks);
    md.pp = l.integer_or("pp", 1, 1, kMaxRanks);
    md.dp = l.integer_or("dp", 1, 1, kMaxRanks);
  }
  if (m.has("rng")) {
    const auto& r = m.at("rng");
    if (!r.is_array()) fail("{}: rng must be an array, got {}", w, json_brief(r));
    for (size_t i = 0; i < r.size(); ++i) {
      JsonFields e(r[i], fmt::format("{}: rng[{}]", w, i));
      md.rng.push_back({e.integer("rank", 0, kMaxRanks), e.uinteger("seed"), e.uinteger("offset"), e.uinteger("tp_seed"),
                        e.uinteger("tp_offset")});
    }
  }
  if (m.has("fp8")) md.fp8 = m.at("fp8");
  if (md.version == 1) return md;
  const auto& tensors = m.at("tensors");
  if (!tensors.is_object()) fail("{}: tensors must be an object, got {}", w, json_brief(tensors));
  for (auto& [name, t] : tensors.items()) {
    const std::string what = fmt::format("{}: tensor '{}'", w, name.substr(0, 200));
    JsonFields tf(t, what);
    TensorIndex ti;
    ti.shape = json_int_array(tf.at("shape"), tf.what("shape"), 0, INT64_MAX);
    checked_product(ti.shape, what + " shape");
    const auto& pieces = tf.at("pieces");
    if (!pieces.is_array()) fail("{}: pieces must be an array, got {}", what, json_brief(pieces));
    for (size_t i = 0; i < pieces.size(); ++i)
      ti.pieces.push_back(parse_piece(pieces[i], fmt::format("{} piece {}", what, i), ti.shape, md.files));
    md.tensors[name] = std::move(ti);
  }
  return md;
}

TrainingState parse_state(const nlohmann::json& j, const std::string& where, int64_t iteration) {
  JsonFields s(j, fmt::format("'{}'", where));
  TrainingState st;
  st.iteration = s.integer("iteration", 0, kMaxIteration);
  if (iteration != kReleaseIteration && st.iteration != iteration)
    fail("{}: iteration is {}, but the checkpoint directory is iteration {} (a state.json from another "
         "checkpoint?)",
         s.where(), st.iteration, iteration);
  st.consumed_train_samples = s.integer("consumed_train_samples", 0, kMaxSamples);
  st.consumed_valid_samples = s.integer("consumed_valid_samples", 0, kMaxSamples);
  // Every iteration steps the optimizer at most once, or is skipped.
  st.optimizer_steps = s.integer("optimizer_steps", 0, st.iteration);
  // Older checkpoints: the scheduler followed the consumed samples.
  st.scheduler_samples =
      s.integer_or("scheduler_samples", st.consumed_train_samples, 0, st.consumed_train_samples);
  st.has_rng = s.boolean("has_rng");
  st.rng_seed = s.uinteger("rng_seed");
  st.rng_offset = s.uinteger("rng_offset");
  st.has_optimizer = s.boolean_or("has_optimizer", true);
  st.skipped_iterations = s.integer_or("skipped_iterations", 0, 0, st.iteration);
  st.nan_iterations = s.integer_or("nan_iterations", 0, 0, st.iteration);
  if (s.has("grad_scaler")) {  // --fp16 checkpoints only
    JsonFields g(s.at("grad_scaler"), s.what("grad_scaler"));
    const double scale = json_number(g.at("scale"), g.what("scale"), 0, 3.4e38);
    if (scale <= 0) fail("{} must be positive, got {}", g.what("scale"), scale);
    st.grad_scaler = optim::GradScalerState{static_cast<float>(scale), g.integer("growth_tracker", 0, kMaxIteration),
                                            g.integer("hysteresis_tracker", -kMaxIteration, kMaxIteration)};
  }
  st.args = s.at("args");
  check_model_args(JsonFields(st.args, s.what("args")));
  return st;
}

}  // namespace mt::checkpoint
