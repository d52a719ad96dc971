#include "data/tokenizers/tiktoken_tokenizer.h"

#include <algorithm>
#include <limits>
#include <set>

#include "core/error.h"
#include "data/tokenizers/file_util.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {
namespace {

const std::vector<std::string> kRequired = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};

// Standard base64 (with padding); false on any other character or a bad length.
bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<size_t>(k)];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = value(c)) < 0) {
        return false;
      }
    }
    const uint32_t n = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return true;
}

}  // namespace

TikTokenizer::TikTokenizer(const std::string& path, const TikTokenOptions& o) : vocab_size_(o.vocab_size) {
  if (o.pattern != "v1" && o.pattern != "v2")
    fail("--tiktoken-pattern must be v1 or v2, got '{}'", o.pattern);
  // Megatron's checks, as messages naming the flags.
  special_ = o.special_tokens.empty() ? kRequired : o.special_tokens;
  for (const std::string& r : kRequired)
    if (std::find(special_.begin(), special_.end(), r) == special_.end())
      fail("--tokenizer-special-tokens must include {} (TikTokenizer needs <unk> <s> </s> <mask> <pad> <cls> <sep>)", r);
  if (std::set<std::string>(special_.begin(), special_.end()).size() != special_.size())
    fail("--tokenizer-special-tokens: the special tokens must be distinct");
  if (!(static_cast<int64_t>(special_.size()) <= o.num_special_tokens && o.num_special_tokens < o.vocab_size))
    fail("--tiktoken-num-special-tokens ({}) must be at least the number of special tokens ({}) and below "
         "--vocab-size ({})", o.num_special_tokens, special_.size(), o.vocab_size);
  if (o.vocab_size > std::numeric_limits<int32_t>::max())
    fail("--vocab-size {} is too large for TikTokenizer's 32-bit ids", o.vocab_size);
  for (int64_t i = static_cast<int64_t>(special_.size()); i < o.num_special_tokens; ++i)
    special_.push_back("<SPECIAL_" + std::to_string(i) + ">");
  if (std::set<std::string>(special_.begin(), special_.end()).size() != special_.size())
    fail("--tokenizer-special-tokens: a token clashes with a <SPECIAL_i> filler");
  auto index = [&](const char* t) {
    return static_cast<int32_t>(std::find(special_.begin(), special_.end(), t) - special_.begin());
  };
  for (size_t s = 0; s < special_.size(); ++s) {
    special_ids_.emplace(special_[s], static_cast<int32_t>(s));
    special_first_[static_cast<unsigned char>(special_[s][0])] = true;
    if (std::find(special_lengths_.begin(), special_lengths_.end(), special_[s].size()) == special_lengths_.end())
      special_lengths_.push_back(special_[s].size());
  }
  std::sort(special_lengths_.rbegin(), special_lengths_.rend());  // longest first
  bos_ = index("<s>");
  eos_ = index("</s>");
  pad_ = index("<pad>");

  const nlohmann::json vocab = read_tokenizer_json(path, "--tokenizer-model");
  if (!vocab.is_array())
    fail("--tokenizer-model {}: expected Megatron's TikTokenizer vocabulary (a JSON list of {{rank, token_bytes, "
         "token_str}})", path);
  const auto offset = static_cast<int32_t>(o.num_special_tokens);
  const int64_t inner = o.vocab_size - o.num_special_tokens;
  if (static_cast<int64_t>(vocab.size()) < inner)
    fail("--tokenizer-model {}: {} entries, fewer than --vocab-size ({}) minus --tiktoken-num-special-tokens ({}); "
         "lower --vocab-size", path, vocab.size(), o.vocab_size, o.num_special_tokens);
  if (inner < 256)
    fail("--vocab-size ({}) minus --tiktoken-num-special-tokens ({}) must keep the 256 byte tokens", o.vocab_size,
         o.num_special_tokens);
  bytes_.resize(static_cast<size_t>(inner));
  ranks_.reserve(static_cast<size_t>(inner));
  std::string b;
  for (int64_t i = 0; i < inner; ++i) {
    const nlohmann::json& e = vocab[static_cast<size_t>(i)];
    if (!e.is_object() || e.size() != 3 || !e.contains("rank") || !e.contains("token_bytes") || !e.contains("token_str"))
      fail("--tokenizer-model {}: entry {} must have exactly the keys rank, token_bytes, token_str", path, i);
    if (!e["rank"].is_number_integer() || e["rank"].get<int64_t>() != i)
      fail("--tokenizer-model {}: entry {} has rank {} (ranks must run 0, 1, 2, ... in order)", path, i,
           e["rank"].dump().substr(0, 40));
    if (!e["token_bytes"].is_string() || !base64_decode(e["token_bytes"].get<std::string>(), b) || b.empty())
      fail("--tokenizer-model {}: entry {}: token_bytes is not base64 of a non-empty token", path, i);
    if (i < 256 && !(b.size() == 1 && static_cast<unsigned char>(b[0]) == i))
      fail("--tokenizer-model {}: entry {} must be the single byte {} (the first 256 ranks are the bytes in order)",
           path, i, i);
    if (!ranks_.emplace(b, static_cast<int32_t>(i) + offset).second)
      fail("--tokenizer-model {}: entry {} repeats an earlier token's bytes", path, i);
    bytes_[static_cast<size_t>(i)] = b;
  }
  pattern_ = std::make_unique<Regex>(o.pattern == "v1" ? kTikTokenPatternV1 : kTikTokenPatternV2,
                                     "--tiktoken-pattern " + o.pattern);
}

int32_t TikTokenizer::rank_of(std::string_view bytes) const {
  auto it = ranks_.find(bytes);
  return it == ranks_.end() ? std::numeric_limits<int32_t>::max() : it->second;
}

// tiktoken's byte_pair_merge: start from single bytes and repeatedly join the adjacent pair whose
// joined bytes have the lowest rank (the leftmost among equals) until no pair is in the vocabulary.
void TikTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (int32_t id = rank_of(piece); id != std::numeric_limits<int32_t>::max()) {
    out.push_back(id);
    return;
  }
  std::vector<size_t> cut(piece.size() + 1);  // part k is piece[cut[k], cut[k + 1])
  for (size_t i = 0; i <= piece.size(); ++i) cut[i] = i;
  for (;;) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t at = 0;
    for (size_t k = 0; k + 2 < cut.size(); ++k) {
      const int32_t r = rank_of(piece.substr(cut[k], cut[k + 2] - cut[k]));
      if (r < best) {
        best = r;
        at = k;
      }
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    cut.erase(cut.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (size_t k = 0; k + 1 < cut.size(); ++k) out.push_back(rank_of(piece.substr(cut[k], cut[k + 1] - cut[k])));
}

void TikTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  pattern_->for_each_match(text, [&](size_t b, size_t e) { merge_piece(text.substr(b, e - b), out); });
}

std::vector<int32_t> TikTokenizer::encode(std::string_view text) const {
  std::string fixed;
  text = utf8::valid_text(text, fixed);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  // Special tokens written in the text: each occurrence (the longest where two start at the same
  // place) is its id; the text between them is encoded ordinarily.
  size_t done = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!special_first_[static_cast<unsigned char>(text[i])]) continue;
    for (size_t len : special_lengths_) {
      if (len > text.size() - i) continue;
      auto it = special_ids_.find(text.substr(i, len));
      if (it == special_ids_.end()) continue;
      encode_ordinary(text.substr(done, i - done), ids);
      ids.push_back(it->second);
      done = i + len;
      i = done - 1;
      break;
    }
  }
  encode_ordinary(text.substr(done), ids);
  return ids;
}

std::string TikTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string bytes;
  const auto n = static_cast<int64_t>(special_.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < n) {
      bytes += special_[static_cast<size_t>(id)];
    } else if (id >= n && id - n < static_cast<int64_t>(bytes_.size())) {
      bytes += bytes_[static_cast<size_t>(id - n)];
    } else {
      fail("TikTokenizer: cannot decode id {}: outside the vocabulary of {}", id, vocab_size_);
    }
  }
  return utf8::sanitize(bytes);
}

}  // namespace mt::data
