#pragma once
// Checkpoints carry their tokenizer: its files are copied into ITER/tokenizer/ when saving, and
// the checkpoint's args name them (args.tokenizer_files: option -> path inside the iteration
// directory), so generate, convert and --use-checkpoint-args work after the original files are
// gone. A checkpoint without that entry (written before) keeps pointing at the original paths.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace mt::checkpoint {

// A file copied into the checkpoint: where it is now, and its name inside the iteration directory.
struct Asset {
  std::string source;
  std::string name;  // "tokenizer/<file>"
};

// The files of `t` (GPT-2 vocab and merges, a SentencePiece model, a HuggingFace tokenizer.json
// with its tokenizer_config.json / special_tokens_map.json), and the args entry naming them.
std::vector<Asset> tokenizer_assets(const data::TokenizerOptions& t);
nlohmann::json tokenizer_files_json(const data::TokenizerOptions& t);

// Points `t` at the copies inside `iter_dir` when the checkpoint's args name them.
void use_saved_tokenizer(const std::string& iter_dir, const nlohmann::json& args, data::TokenizerOptions& t);

// An asset name: "tokenizer/" and one plain file name (never absolute, never "..").
bool is_asset_name(const std::string& name);

}  // namespace mt::checkpoint
