#include "checkpoint/tokenizer_files.h"

#include <algorithm>
#include <filesystem>

#include "checkpoint/io_util.h"
#include "core/error.h"

namespace mt::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDir = "tokenizer";

// Fixed names by role, so two options whose files share a base name cannot collide; a
// HuggingFace tokenizer keeps its own names, which its loader looks for.
struct Role {
  const char* option;
  std::string data::TokenizerOptions::*field;
  const char* name;
};
const Role kRoles[] = {{"vocab_file", &data::TokenizerOptions::vocab_file, "vocab.json"},
                       {"merge_file", &data::TokenizerOptions::merge_file, "merges.txt"}};

bool hf(const data::TokenizerOptions& t) { return t.type == "HuggingFaceTokenizer"; }

}  // namespace

bool is_asset_name(const std::string& name) {
  const std::string prefix = std::string(kDir) + "/";
  return name.rfind(prefix, 0) == 0 && is_plain_file_name(name.substr(prefix.size()));
}

std::vector<Asset> tokenizer_assets(const data::TokenizerOptions& t) {
  std::vector<Asset> out;
  auto add = [&](const fs::path& src, const std::string& name) {
    std::error_code ec;
    if (fs::is_regular_file(src, ec)) out.push_back({src.string(), std::string(kDir) + "/" + name});
  };
  for (const Role& r : kRoles)
    if (!(t.*r.field).empty()) add(t.*r.field, r.name);
  if (t.tokenizer_model.empty()) return out;
  if (!hf(t)) {
    add(t.tokenizer_model, "tokenizer.model");
    return out;
  }
  const fs::path m(t.tokenizer_model);
  const fs::path dir = fs::is_directory(m) ? m : m.parent_path();
  add(fs::is_directory(m) ? m / "tokenizer.json" : m, "tokenizer.json");
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json", "generation_config.json"})
    add(dir / extra, extra);
  return out;
}

nlohmann::json tokenizer_files_json(const data::TokenizerOptions& t) {
  // Only the options whose files are copied (tokenizer_assets) point into the checkpoint.
  const std::vector<Asset> assets = tokenizer_assets(t);
  auto copied = [&](const std::string& name) {
    return std::any_of(assets.begin(), assets.end(), [&](const Asset& a) { return a.name == std::string(kDir) + "/" + name; });
  };
  nlohmann::json j = nlohmann::json::object();
  for (const Role& r : kRoles)
    if (copied(r.name)) j[r.option] = std::string(kDir) + "/" + r.name;
  if (hf(t) && copied("tokenizer.json")) j["tokenizer_model"] = std::string(kDir);
  if (!hf(t) && copied("tokenizer.model")) j["tokenizer_model"] = std::string(kDir) + "/tokenizer.model";
  return j;
}

void use_saved_tokenizer(const std::string& iter_dir, const nlohmann::json& args, data::TokenizerOptions& t) {
  auto it = args.find("tokenizer_files");
  if (it == args.end() || !it->is_object()) return;
  for (const auto& [option, rel] : it->items()) {
    if (!rel.is_string()) fail("{}/state.json: args.tokenizer_files.{} must be a path", iter_dir, option);
    const std::string r = rel.get<std::string>();
    if (r != kDir && !is_asset_name(r))
      fail("{}/state.json: args.tokenizer_files.{} '{}' points outside the checkpoint", iter_dir, option, r.substr(0, 200));
    const std::string path = (fs::path(iter_dir) / r).string();
    if (option == "vocab_file") t.vocab_file = path;
    else if (option == "merge_file") t.merge_file = path;
    else if (option == "tokenizer_model") t.tokenizer_model = path;
  }
}

}  // namespace mt::checkpoint
