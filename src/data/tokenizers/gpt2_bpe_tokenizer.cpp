#include "data/tokenizers/gpt2_bpe_tokenizer.h"

#include "core/error.h"
#include "data/tokenizers/byte_level.h"
#include "data/tokenizers/file_util.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_file, const std::string& merge_file) {
  const nlohmann::json enc = read_tokenizer_json(vocab_file, "--vocab-file");
  if (!enc.is_object() || enc.empty()) {
    fail("--vocab-file {}: expected GPT-2's encoder.json (an object token -> id)", vocab_file);
  }
  VocabMap raw_vocab;  // keyed by raw bytes: the model splits words into bytes
  raw_vocab.reserve(enc.size());
  std::string raw;
  for (const auto& [token, idj] : enc.items()) {
    // The ids index a table of the vocabulary's size (Megatron's vocab_size is len(encoder)), so
    // they must lie in [0, entries): one id near 2^30 would otherwise allocate gigabytes.
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= static_cast<int64_t>(enc.size())) {
      fail("--vocab-file {}: id of '{}' is not an integer in [0, {}) (GPT-2's ids run from 0 to the vocabulary "
           "size - 1)", vocab_file, token, enc.size());
    }
    const auto id = idj.get<int32_t>();
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(id + 1);
    id_to_token_[id] = token;
    if (byte_level::decode_token(token, raw)) raw_vocab.emplace(raw, id);
  }
  auto it = enc.find("<|endoftext|>");
  if (it == enc.end()) fail("--vocab-file {}: has no <|endoftext|> token (needed for EOD)", vocab_file);
  eod_ = it->get<int32_t>();

  // Like GPT-2's loader: drop the "#version" first line and the last line.
  const std::string text = read_tokenizer_file(merge_file, "--merge-file");
  std::vector<std::string_view> lines;
  for (size_t pos = 0;;) {
    const size_t nl = text.find('\n', pos);
    lines.emplace_back(std::string_view(text).substr(pos, nl == std::string::npos ? nl : nl - pos));
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  if (lines.size() < 2 || !lines[0].starts_with("#version")) {
    fail("--merge-file {}: expected GPT-2's vocab.bpe (first line '#version: ...')", merge_file);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(lines.size());
  std::string ra, rb;
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    std::string_view l = lines[i];
    const size_t sp = l.find(' ');
    if (sp == std::string_view::npos) continue;
    if (!byte_level::decode_token(l.substr(0, sp), ra) ||
        !byte_level::decode_token(l.substr(sp + 1), rb)) {
      fail("--merge-file {}: line {} is not a merge of byte-level tokens", merge_file, i + 1);
    }
    merges.emplace_back(ra, rb);
  }
  BpeOptions opts;
  opts.byte_units = true;
  bpe_ = std::make_unique<Bpe>(std::move(raw_vocab), merges, opts, "--merge-file " + merge_file);
  pattern_ = std::make_unique<Regex>(kGpt2Pattern, "GPT-2 pattern");
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::string fixed;
  text = utf8::valid_text(text, fixed);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  pattern_->for_each_match(text, [&](size_t b, size_t e) {
    bpe_->encode_word(text.substr(b, e - b), ids);
  });
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes, raw;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) {
      fail("GPT2BPETokenizer: cannot decode id {}: outside the vocabulary of {}", id,
           id_to_token_.size());
    }
    if (byte_level::decode_token(id_to_token_[id], raw)) {
      bytes += raw;
    } else {
      bytes += id_to_token_[id];
    }
  }
  return utf8::sanitize(bytes);
}

}  // namespace mt::data
