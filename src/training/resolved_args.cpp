#include "training/resolved_args.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/tokenizer_files.h"
#include "core/error.h"
#include "core/version.h"

namespace mt {
namespace {

std::string key_of(const std::string& flag) {
  std::string k = flag.substr(2);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

// A value as JSON: a number where the text is one (so the printout reads naturally), else a string.
nlohmann::json value_json(const std::string& v) {
  const nlohmann::json n = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
  return n.is_number() ? n : nlohmann::json(v);
}

std::string value_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// What --use-checkpoint-args restores (Megatron's load_args_from_checkpoint: the model's shape and
// its tokenizer); not the precision, dropout, recomputation or kernels, which a run may change.
bool restored(const FlagParser::Current& c) {
  static const std::set<std::string> kTokenizer = {"--tokenizer-type", "--vocab-file", "--merge-file",
                                                   "--tokenizer-model", "--vocab-size"};
  static const std::set<std::string> kNot = {"--bf16", "--fp16", "--attention-dropout", "--hidden-dropout",
                                             "--init-method-std", "--nondeterministic-attention"};
  if (kTokenizer.count(c.name)) return true;
  if (c.group != "model" && c.group != "mixture of experts") return false;
  return !kNot.count(c.name) && c.name.rfind("--recompute", 0) != 0;
}

}  // namespace

nlohmann::json resolved_arguments(const Arguments& a) {
  nlohmann::json flags = nlohmann::json::object();
  for (const auto& c : pretrain_current_values(a)) {
    nlohmann::json& v = flags[key_of(c.name)];
    if (c.is_switch) {
      v = c.values.at(0) == "true";
    } else if (c.is_list) {
      v = nlohmann::json::array();
      for (const auto& x : c.values) v.push_back(x);
    } else {
      v = value_json(c.values.at(0));
    }
  }
  const int64_t dp = std::max<int64_t>(1, a.data_parallel_size);
  nlohmann::json derived = {{"world_size", a.world_size},
                            {"data_parallel_size", a.data_parallel_size},
                            {"virtual_pipeline_model_parallel_size", a.virtual_pipeline_model_parallel_size},
                            {"num_micro_batches", a.global_batch_size / std::max<int64_t>(1, a.micro_batch_size * dp)},
                            {"padded_vocab_size", a.model.vocab_size},
                            {"orig_vocab_size", a.model.orig_vocab_size},
                            {"attention_backend", a.attention_backend},
                            {"ckpt_format", a.ckpt_format},
                            {"dataloader_type", a.dataloader_type},
                            {"step_batch_size_schedule", a.step_batch_size_schedule},
                            {"device", a.device}};
  return {{"megatron_version", megatron_version()}, {"arguments", flags}, {"derived", derived}};
}

std::vector<std::string> checkpoint_arg_words(const Arguments& given) {
  if (std::error_code ec; !std::filesystem::is_directory(given.load, ec))
    fail("--use-checkpoint-args: --load {} does not exist or is not a directory", given.load);
  const auto it = checkpoint::latest_iteration(given.load);
  if (!it) fail("--use-checkpoint-args: --load {} holds no checkpoint (no latest_checkpointed_iteration.txt)", given.load);
  const std::string dir = checkpoint::iteration_dir(given.load, *it);
  const checkpoint::TrainingState st = checkpoint::read_state(given.load, *it);
  auto run = st.args.find("run_args");
  if (run == st.args.end() || !run->is_object() || !run->contains("arguments") || !(*run)["arguments"].is_object())
    fail("--use-checkpoint-args: {} was written before checkpoints stored their arguments; give the model flags",
         dir);
  const nlohmann::json& saved = (*run)["arguments"];
  // The tokenizer files: the checkpoint's copies.
  data::TokenizerOptions tok;
  checkpoint::use_saved_tokenizer(dir, st.args, tok);
  const std::map<std::string, std::string> tok_paths = {
      {"vocab_file", tok.vocab_file}, {"merge_file", tok.merge_file}, {"tokenizer_model", tok.tokenizer_model}};
  const Arguments fresh;
  const auto defaults = pretrain_current_values(fresh);
  std::vector<std::string> words;
  for (const auto& c : defaults) {
    if (!restored(c) || given.was_given(c.name.c_str())) continue;
    const std::string key = key_of(c.name);
    auto v = saved.find(key);
    if (v == saved.end() || v->is_null()) continue;
    if (auto p = tok_paths.find(key); p != tok_paths.end() && !p->second.empty()) {
      words.insert(words.end(), {c.name, p->second});
      continue;
    }
    if (c.is_switch) {
      if (v->is_boolean() && v->get<bool>()) words.push_back(c.name);
      continue;
    }
    if (c.is_list) {
      if (!v->is_array() || v->empty()) continue;
      words.push_back(c.name);
      for (const auto& x : *v) words.push_back(value_text(x));
      continue;
    }
    const std::string text = value_text(*v);
    if (text == c.values.at(0) || text.empty()) continue;  // the default: nothing to restore
    words.insert(words.end(), {c.name, text});
  }
  return words;
}

}  // namespace mt
