#include "data/preprocess_encode.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace mt::data {

JsonlEncoder::JsonlEncoder(std::unique_ptr<Tokenizer> tokenizer, std::vector<std::string> keys, bool append_eod)
    : tok_(std::move(tokenizer)), keys_(std::move(keys)), append_eod_(append_eod), eod_(tok_->eod()) {}

EncodedBatch JsonlEncoder::encode(const LineBatch& batch) {
  EncodedBatch out;
  out.keys.resize(keys_.size());
  out.errors.reserve(batch.lines.size());
  for (const auto& line : batch.lines) out.errors.push_back(encode_line(line, out));
  return out;
}

std::string JsonlEncoder::encode_line(const std::string& line, EncodedBatch& out) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann prefixes "[json.exception.parse_error.101] "; the rest says where and why.
    std::string why = e.what();
    const auto p = why.find("] ");
    if (p != std::string::npos) why = why.substr(p + 2);
    return line.find_first_not_of(" \t") == std::string::npos ? "empty line, not a JSON document"
                                                                : "invalid JSON: " + why;
  }
  if (!doc.is_object()) return "not a JSON object";
  // Check every key before emitting anything, so a bad line leaves no partial output.
  for (const auto& key : keys_) {
    auto it = doc.find(key);
    if (it == doc.end()) return "no key '" + key + "' (choose keys with --json-keys)";
    if (it->is_string()) continue;
    if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return "key '" + key + "' is a list with a non-string element";
      }
      continue;
    }
    return "key '" + key + "' is not a string (or a list of strings)";
  }
  // Tokenize every key into scratch first for the same reason.
  std::vector<std::vector<int32_t>> ids(keys_.size());
  std::vector<std::vector<int32_t>> lens(keys_.size());
  for (size_t k = 0; k < keys_.size(); ++k) {
    const auto& v = doc[keys_[k]];
    sentences_.clear();
    if (v.is_string()) {
      sentences_.push_back(v.get<std::string>());
    } else {
      for (const auto& s : v) sentences_.push_back(s.get<std::string>());
    }
    for (const auto& s : sentences_) {
      std::vector<int32_t> t;
      try {
        t = tok_->encode(s);
      } catch (const Error& e) {
        return std::string("tokenizer: ") + e.what();
      }
      if (t.empty()) continue;  // empty sentences are dropped, as in Megatron
      ids[k].insert(ids[k].end(), t.begin(), t.end());
      lens[k].push_back(static_cast<int32_t>(t.size()));
    }
    if (!ids[k].empty() && append_eod_) {
      ids[k].push_back(eod_);
      ++lens[k].back();
    }
  }
  for (size_t k = 0; k < keys_.size(); ++k) {
    KeyTokens& kt = out.keys[k];
    kt.tokens.insert(kt.tokens.end(), ids[k].begin(), ids[k].end());
    kt.seq_lens.insert(kt.seq_lens.end(), lens[k].begin(), lens[k].end());
    kt.nseq.push_back(static_cast<uint32_t>(lens[k].size()));
  }
  return "";
}

}  // namespace mt::data
