#pragma once
// The tokenizer side of HuggingFace model directories: which tokenizer a directory holds (for
// `generate --load HF_DIR`), and the files an export writes beside the weights (the tokenizer's
// own files and generation_config.json), so the exported directory is usable on its own.
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace mt {

// tokenizer.json -> HuggingFaceTokenizer; vocab.json + merges.txt -> GPT2BPETokenizer;
// tokenizer.model -> Llama2Tokenizer (SentencePiece with BOS, as HF's LlamaTokenizer). False when
// the directory holds none of them.
bool tokenizer_of_hf_dir(const std::string& dir, data::TokenizerOptions& t);

// Copies `t`'s files into `out` under the names HuggingFace expects, and writes
// generation_config.json (the tokenizer's own when it has one; else BOS/EOS from `hf_config`, a
// recorded config.json, or the tokenizer's EOD).
void write_hf_tokenizer_files(const std::string& out, const data::TokenizerOptions& t, const nlohmann::json& hf_config);

}  // namespace mt
