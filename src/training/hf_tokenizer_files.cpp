#include "training/hf_tokenizer_files.h"

#include <filesystem>
#include <fstream>

#include "checkpoint/tokenizer_files.h"
#include "core/error.h"

namespace mt {
namespace fs = std::filesystem;

bool tokenizer_of_hf_dir(const std::string& dir, data::TokenizerOptions& t) {
  const fs::path d(dir);
  std::error_code ec;
  if (fs::is_regular_file(d / "tokenizer.json", ec)) {
    t.type = "HuggingFaceTokenizer";
    t.tokenizer_model = dir;
  } else if (fs::is_regular_file(d / "vocab.json", ec) && fs::is_regular_file(d / "merges.txt", ec)) {
    t.type = "GPT2BPETokenizer";
    t.vocab_file = (d / "vocab.json").string();
    t.merge_file = (d / "merges.txt").string();
  } else if (fs::is_regular_file(d / "tokenizer.model", ec)) {
    t.type = "Llama2Tokenizer";
    t.tokenizer_model = (d / "tokenizer.model").string();
  } else {
    return false;
  }
  return true;
}

void write_hf_tokenizer_files(const std::string& out, const data::TokenizerOptions& t, const nlohmann::json& hf_config) {
  bool have_generation_config = false;
  // The checkpoint's asset names are HuggingFace's file names (tokenizer/vocab.json, ...).
  for (const checkpoint::Asset& a : checkpoint::tokenizer_assets(t)) {
    const fs::path dst = fs::path(out) / fs::path(a.name).filename();
    std::error_code ec;
    fs::copy_file(a.source, dst, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("--output: cannot copy the tokenizer file '{}' to '{}': {}", a.source, dst.string(), ec.message());
    have_generation_config = have_generation_config || dst.filename() == "generation_config.json";
  }
  if (have_generation_config) return;
  nlohmann::json g = {{"_from_model_config", true}};
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (hf_config.is_object() && hf_config.contains(k) && !hf_config[k].is_null()) g[k] = hf_config[k];
  if (!g.contains("eos_token_id") && !t.type.empty()) {
    const auto tok = data::build_tokenizer(t);
    g["eos_token_id"] = tok->eod();
    if (tok->bos() >= 0 && !g.contains("bos_token_id")) g["bos_token_id"] = tok->bos();
  }
  std::ofstream f(fs::path(out) / "generation_config.json");
  f << g.dump(2) << "\n";
  if (!f) fail("--output: cannot write '{}/generation_config.json'", out);
}

}  // namespace mt
