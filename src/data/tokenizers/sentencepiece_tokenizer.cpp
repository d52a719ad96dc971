#include "data/tokenizers/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <unordered_map>

#include "core/error.h"
#include "core/files.h"

namespace mt::data {

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), flavor_(flavor) {
  if (model_file.empty()) {
    fail("--tokenizer-type {} needs --tokenizer-model (a SentencePiece .model file)", name());
  }
  require_regular_file(model_file, "--tokenizer-model");  // a FIFO would block the load
  const auto status = sp_->Load(model_file);
  if (!status.ok()) {
    fail("--tokenizer-model {}: not a SentencePiece model ({})", model_file, status.ToString());
  }
  const int n = sp_->GetPieceSize();
  if (flavor_ != Flavor::Megatron) {
    vocab_size_ = n;
    eod_ = sp_->eos_id();
    bos_ = sp_->bos_id();
    pad_ = sp_->pad_id();
    return;
  }

  // Megatron's _SentencePieceTokenizer: pieces first, then each special string not already a
  // piece gets the next id. A disabled pad/bos/eos (id -1) becomes <PAD>/<BOS>/<EOS>.
  std::unordered_map<std::string, int32_t> vocab;
  for (int i = 0; i < n; ++i) vocab.emplace(sp_->IdToPiece(i), i);
  int32_t next = n;
  auto add = [&](const std::string& t) {
    auto [it, inserted] = vocab.emplace(t, next);
    if (inserted) ++next;
    for (auto& [s, id] : specials_) {
      if (s == t) return it->second;  // a dict keeps its first position
    }
    specials_.emplace_back(t, it->second);
    return it->second;
  };
  auto piece_or = [&](int id, const char* fallback) {
    return id >= 0 && id < n ? sp_->IdToPiece(id) : std::string(fallback);
  };
  add("<CLS>");
  add("<SEP>");
  eod_ = add("<EOD>");
  add("<MASK>");
  pad_ = add(piece_or(sp_->pad_id(), "<PAD>"));
  bos_ = add(piece_or(sp_->bos_id(), "<BOS>"));
  add(piece_or(sp_->eos_id(), "<EOS>"));
  vocab_size_ = static_cast<int64_t>(vocab.size());
}

std::string SentencePieceTokenizer::name() const {
  switch (flavor_) {
    case Flavor::Megatron: return "SentencePieceTokenizer";
    case Flavor::Gpt: return "GPTSentencePieceTokenizer";
    case Flavor::Llama2: return "Llama2Tokenizer";
  }
  return "SentencePieceTokenizer";
}

void SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<int> out;
  const auto status = sp_->Encode(text, &out);
  if (!status.ok()) fail("{}: encoding failed: {}", name(), status.ToString());
  ids.insert(ids.end(), out.begin(), out.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (flavor_ == Flavor::Llama2) ids.push_back(bos_);
  if (flavor_ != Flavor::Megatron) {
    encode_plain(text, ids);
    return ids;
  }
  // Megatron (from NeMo): repeatedly take the earliest special string, the first-listed one on a
  // tie, and encode the text before it on its own.
  std::vector<size_t> next(specials_.size());
  for (size_t k = 0; k < specials_.size(); ++k) next[k] = text.find(specials_[k].first);
  size_t pos = 0;
  while (true) {
    size_t best = specials_.size();
    for (size_t k = 0; k < specials_.size(); ++k) {
      if (next[k] != std::string_view::npos && next[k] < pos) next[k] = text.find(specials_[k].first, pos);
      if (next[k] == std::string_view::npos) continue;
      if (best == specials_.size() || next[k] < next[best]) best = k;
    }
    if (best == specials_.size()) break;
    encode_plain(text.substr(pos, next[best] - pos), ids);
    ids.push_back(specials_[best].second);
    pos = next[best] + specials_[best].first.size();
  }
  encode_plain(text.substr(pos), ids);
  return ids;
}

std::string SentencePieceTokenizer::decode_plain(const std::vector<int32_t>& ids) const {
  std::string out;
  if (ids.empty()) return out;
  const int n = sp_->GetPieceSize();
  for (int32_t id : ids) {
    if (id < 0 || id >= n) fail("{}: cannot decode id {}: outside the model's {} pieces", name(), id, n);
  }
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &out);
  if (!status.ok()) fail("{}: decoding failed: {}", name(), status.ToString());
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  if (flavor_ != Flavor::Megatron) return decode_plain(ids);
  // Megatron: special ids are written as their strings with a space on each side.
  std::string text;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    const std::string* special = nullptr;
    for (const auto& [s, sid] : specials_) {
      if (sid == id) special = &s;
    }
    if (!special) {
      run.push_back(id);
      continue;
    }
    text += decode_plain(run) + " " + *special + " ";
    run.clear();
  }
  return text + decode_plain(run);
}

}  // namespace mt::data
