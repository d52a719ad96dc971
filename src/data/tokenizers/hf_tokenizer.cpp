#include "data/tokenizers/hf_tokenizer.h"

#include <filesystem>
#include <limits>

#include "core/error.h"
#include "data/tokenizers/byte_level.h"
#include "data/tokenizers/file_util.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {

namespace fs = std::filesystem;
using hf::Where;

namespace {

// transformers' clean_up_tokenization: undoes spaces that word-level tokenizers put before
// punctuation and contractions.
std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string_view f(from), t(to);
    std::string out;
    size_t last = 0;
    for (size_t p = s.find(f); p != std::string::npos; p = s.find(f, p + f.size())) {
      out.append(s, last, p - last);
      out.append(t);
      last = p + f.size();
    }
    out.append(s, last);
    s = std::move(out);
  }
  return s;
}

// A token given in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return {};
}

// A token id given in the file: an integer in int32's range (ids of any other type or size would
// be narrowed silently, or undefined for floats).
int32_t token_id_value(const nlohmann::json& j, const Where& w) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    hf::bad(w, "token id " + j.dump() + " is not an integer in [0, 2^31)");
  }
  return static_cast<int32_t>(j.get<int64_t>());
}

}  // namespace

HfTokenizer::~HfTokenizer() = default;

HfTokenizer::HfTokenizer(const std::string& path) {
  try {
    load(path);
  } catch (const nlohmann::json::exception& e) {
    // A field of an unexpected JSON type somewhere the accessors above do not check.
    fail("--tokenizer-model {}: unexpected tokenizer file structure ({}); use files saved by "
         "HF tokenizers/transformers", path, e.what());
  }
}

void HfTokenizer::load(const std::string& path) {
  if (path.empty()) {
    fail("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model: a tokenizer.json or a "
         "directory holding one");
  }
  std::string file = path, dir;
  if (fs::is_directory(path)) {
    dir = path;
    file = (fs::path(path) / "tokenizer.json").string();
    if (!fs::exists(file)) {
      fail("--tokenizer-model {}: no tokenizer.json in this directory (hub names are not "
           "downloaded; point to a local copy)", path);
    }
  } else if (!fs::exists(path)) {
    fail("--tokenizer-model {}: no such file or directory (hub names are not downloaded; point "
         "to a local tokenizer.json or its directory)", path);
  } else {
    dir = fs::path(path).parent_path().string();
  }
  const nlohmann::json j = read_tokenizer_json(file, "--tokenizer-model");
  if (!j.is_object() || !j.contains("model")) {
    fail("--tokenizer-model {}: not a HuggingFace tokenizer.json (no \"model\")", file);
  }
  const Where root{file, ""};
  normalizer_ = hf::make_normalizer(j.value("normalizer", nlohmann::json()), root.child("normalizer"));
  pre_tokenizer_ =
      hf::make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()), root.child("pre_tokenizer"));
  decoder_ = hf::make_decoder(j.value("decoder", nlohmann::json()), root.child("decoder"));

  // Added tokens.
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    const auto& list = j["added_tokens"];
    for (size_t i = 0; i < list.size(); ++i) {
      const Where w = root.child("added_tokens").index(i);
      const auto& a = list[i];
      hf::AddedToken t;
      t.content = hf::get_string(a, "content", w);
      const int64_t id = hf::get_int(a, "id", w, -1);
      if (id < 0 || id > std::numeric_limits<int32_t>::max()) hf::bad(w, "added token without a valid id");
      t.id = static_cast<int32_t>(id);
      t.special = hf::get_bool(a, "special", w, false);
      t.lstrip = hf::get_bool(a, "lstrip", w, false);
      t.rstrip = hf::get_bool(a, "rstrip", w, false);
      t.single_word = hf::get_bool(a, "single_word", w, false);
      t.normalized = hf::get_bool(a, "normalized", w, !t.special);
      added_.push_back(std::move(t));
    }
  }
  load_model(j["model"], file);

  std::vector<const hf::AddedToken*> raw, norm;
  for (const auto& t : added_) {
    if (t.normalized && normalizer_) {
      hf::AddedToken n = t;
      normalizer_->normalize(n.content);
      normalized_forms_.push_back(std::move(n));
    } else {
      raw.push_back(&t);
    }
  }
  for (const auto& t : normalized_forms_) norm.push_back(&t);
  raw_matcher_ = hf::AddedTokenMatcher(std::move(raw));
  normalized_matcher_ = hf::AddedTokenMatcher(std::move(norm));

  // Vocabulary as HF's get_vocab(with_added_tokens=True) sees it: model tokens and added tokens.
  for (const auto& t : added_) {
    id_to_token_[t.id] = t.content;
    token_to_id_.insert_or_assign(t.content, t.id);
  }
  vocab_size_ = static_cast<int64_t>(token_to_id_.size());

  load_post_processor(j.value("post_processor", nlohmann::json()), file);
  load_config(dir);
}

void HfTokenizer::load_model(const nlohmann::json& m, const std::string& file) {
  const Where w{file, "model"};
  const std::string type = m.is_object() ? hf::get_string(m, "type", w, "BPE") : "";
  if (type != "BPE" || !m.contains("merges")) {
    fail("--tokenizer-model {}: model type '{}' is not supported; HuggingFaceTokenizer handles "
         "BPE models (use SentencePieceTokenizer for .model files)", file, type);
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) hf::bad(w, "vocab must be an object");
  const bool byte_level = pre_tokenizer_ && pre_tokenizer_->byte_level();

  // The BPE model sees pieces in the same spelling as its vocabulary; byte-level vocabularies
  // are converted to raw bytes here so that pieces need no per-character mapping.
  VocabMap vocab;
  vocab.reserve(m["vocab"].size());
  std::string raw;
  for (const auto& [token, idj] : m["vocab"].items()) {
    if (!idj.is_number_integer() || idj.get<int64_t>() < 0 || idj.get<int64_t>() >= (1LL << 31)) {
      hf::bad(w, "id of '" + token + "' is not a non-negative integer");
    }
    const auto id = idj.get<int32_t>();
    id_to_token_[id] = token;
    token_to_id_.insert_or_assign(token, id);
    if (!byte_level) {
      vocab.insert_or_assign(token, id);
    } else if (byte_level::decode_token(token, raw)) {
      vocab.insert_or_assign(raw, id);
    }
  }

  std::vector<std::pair<std::string, std::string>> merges;
  const auto& ml = m["merges"];
  if (!ml.is_array()) hf::bad(w, "merges must be a list");
  merges.reserve(ml.size());
  std::string ra, rb;
  for (size_t i = 0; i < ml.size(); ++i) {
    std::string a, b;
    if (ml[i].is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string s = ml[i].get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        hf::bad(w.child(".merges").index(i), "merge is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (ml[i].is_array() && ml[i].size() == 2 && ml[i][0].is_string() && ml[i][1].is_string()) {
      a = ml[i][0].get<std::string>();
      b = ml[i][1].get<std::string>();
    } else {
      hf::bad(w.child(".merges").index(i), "merge must be \"a b\" or [\"a\", \"b\"]");
    }
    if (byte_level) {
      // A merge of tokens outside the byte alphabet can never apply to byte-level pieces.
      if (!byte_level::decode_token(a, ra) || !byte_level::decode_token(b, rb)) continue;
      merges.emplace_back(ra, rb);
    } else {
      merges.emplace_back(std::move(a), std::move(b));
    }
  }

  BpeOptions o;
  o.byte_units = byte_level;
  o.byte_fallback = hf::get_bool(m, "byte_fallback", w, false);
  o.ignore_merges = hf::get_bool(m, "ignore_merges", w, false);
  o.fuse_unk = hf::get_bool(m, "fuse_unk", w, false);
  o.continuing_subword_prefix = hf::get_string(m, "continuing_subword_prefix", w);
  o.end_of_word_suffix = hf::get_string(m, "end_of_word_suffix", w);
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0) {
    hf::bad(w, "BPE dropout is not supported (it makes encoding random); set it to null");
  }
  const std::string unk = hf::get_string(m, "unk_token", w);
  if (!unk.empty()) {
    auto it = m["vocab"].find(unk);
    if (it != m["vocab"].end()) o.unk_id = it->get<int32_t>();
  }
  bpe_ = std::make_unique<Bpe>(std::move(vocab), merges, o, "--tokenizer-model " + file);
  if (!byte_level) bpe_->enable_metaspace_cuts();
}

void HfTokenizer::load_post_processor(const nlohmann::json& j, const std::string& file) {
  if (j.is_null()) return;
  const Where w{file, "post_processor"};
  const std::string type = hf::type_of(j, w);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : hf::get_array(j, "processors", w)) load_post_processor(p, file);
    return;
  }
  std::vector<int32_t> pre, post;
  if (type == "TemplateProcessing") {
    const auto& single = hf::get_array(j, "single", w);
    const auto specials = j.value("special_tokens", nlohmann::json::object());
    bool seen_a = false;
    for (const auto& item : single) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken")) hf::bad(w, "template items are SpecialToken or Sequence");
      const std::string name = item["SpecialToken"].value("id", "");
      std::vector<int32_t> ids;
      auto it = specials.find(name);
      if (it != specials.end() && it->contains("ids")) {
        for (const auto& id : hf::get_array(*it, "ids", w)) ids.push_back(token_id_value(id, w));
      } else {
        const int32_t id = token_id(name);
        if (id < 0) hf::bad(w, "template token '" + name + "' is not in the vocabulary");
        ids.push_back(id);
      }
      auto& dst = seen_a ? post : pre;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2) hf::bad(w, std::string(key) + " must be [token, id]");
      (std::string(key) == "cls" ? pre : post).push_back(token_id_value((*it)[1], w));
    }
  } else {
    hf::bad(w, "post-processor type '" + type +
                   "' is not supported (supported: TemplateProcessing, ByteLevel, "
                   "RobertaProcessing, BertProcessing, Sequence)");
  }
  // A later processor wraps the output of the earlier ones.
  prefix_.insert(prefix_.begin(), pre.begin(), pre.end());
  suffix_.insert(suffix_.end(), post.begin(), post.end());
}

int32_t HfTokenizer::token_id(const std::string& token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

void HfTokenizer::load_config(const std::string& dir) {
  nlohmann::json cfg = nlohmann::json::object();
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path map_path = fs::path(dir) / "special_tokens_map.json";
  bool have_cfg = false;
  if (fs::exists(cfg_path)) {
    cfg = read_tokenizer_json(cfg_path.string(), "--tokenizer-model");
    if (!cfg.is_object()) fail("--tokenizer-model {}: expected a JSON object", cfg_path.string());
    have_cfg = true;
  }
  if (fs::exists(map_path)) {  // transformers reads both; the config's entries win
    const nlohmann::json m = read_tokenizer_json(map_path.string(), "--tokenizer-model");
    if (!m.is_object()) fail("--tokenizer-model {}: expected a JSON object", map_path.string());
    for (const char* k : {"bos_token", "eos_token", "pad_token"}) {
      if (m.contains(k) && !cfg.contains(k)) cfg[k] = m[k];
    }
    have_cfg = true;
  }
  auto id_of = [&](const char* key) {
    const std::string t = config_token(cfg, key);
    return t.empty() ? -1 : token_id(t);
  };
  bos_ = id_of("bos_token");
  eos_ = id_of("eos_token");
  pad_ = id_of("pad_token");
  if (!have_cfg) {
    // Without any config transformers knows no special tokens and Megatron would have no EOD;
    // take the usual names from the added tokens instead.
    for (const char* t : {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>"}) {
      if (eos_ < 0) eos_ = token_id(t);
    }
    for (const char* t : {"<s>", "<|begin_of_text|>", "<bos>"}) {
      if (bos_ < 0) bos_ = token_id(t);
    }
    for (const char* t : {"<pad>", "<|pad|>"}) {
      if (pad_ < 0) pad_ = token_id(t);
    }
  }
  // Lenient reads: configs in the wild hold nulls where a value is absent.
  auto flag = [&](const char* key, bool def) {
    auto it = cfg.find(key);
    return it != cfg.end() && it->is_boolean() ? it->get<bool>() : def;
  };
  clean_up_spaces_ = flag("clean_up_tokenization_spaces", false);

  // LlamaTokenizerFast and GemmaTokenizerFast rebuild the post-processor from add_bos_token /
  // add_eos_token when they load, whatever tokenizer.json says.
  auto cls_it = cfg.find("tokenizer_class");
  std::string cls = cls_it != cfg.end() && cls_it->is_string() ? cls_it->get<std::string>() : "";
  if (cls.ends_with("Fast")) cls.resize(cls.size() - 4);
  if (cls == "LlamaTokenizer" || cls == "GemmaTokenizer" || cls == "CodeLlamaTokenizer") {
    const bool add_bos = flag("add_bos_token", true);
    const bool add_eos = flag("add_eos_token", false);
    if ((add_bos && bos_ < 0) || (add_eos && eos_ < 0)) {
      fail("--tokenizer-model {}: tokenizer_config.json asks for add_bos_token/add_eos_token but "
           "names no such token", dir);
    }
    prefix_.clear();
    suffix_.clear();
    if (add_bos) prefix_.push_back(bos_);
    if (add_eos) suffix_.push_back(eos_);
  }
}

void HfTokenizer::encode_section(std::string_view text, bool first, std::vector<int32_t>& ids) const {
  hf::PreTokenized pt;
  pt.buf.assign(text);
  if (normalizer_) normalizer_->normalize(pt.buf);
  if (pt.buf.empty()) return;
  pt.first_section = first;

  auto run = [&](hf::PreTokenized& p) {
    if (p.buf.empty()) return;
    p.pieces.assign(1, {0, p.buf.size()});
    if (pre_tokenizer_) pre_tokenizer_->apply(p);
    for (size_t i = 0; i < p.pieces.size(); ++i) bpe_->encode_word(p.piece(i), ids);
  };
  if (normalized_matcher_.empty()) {
    run(pt);
    return;
  }
  std::vector<hf::AddedTokenMatcher::Segment> segs;
  normalized_matcher_.split(pt.buf, segs);
  for (const auto& s : segs) {
    if (s.token) {
      ids.push_back(s.token->id);
      continue;
    }
    hf::PreTokenized sub;
    sub.buf = pt.buf.substr(s.begin, s.end - s.begin);
    sub.first_section = first && s.begin == 0;
    run(sub);
  }
}

std::vector<int32_t> HfTokenizer::encode_plain(std::string_view text) const {
  std::string fixed;
  text = utf8::valid_text(text, fixed);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_.empty()) {
    encode_section(text, true, ids);
    return ids;
  }
  std::vector<hf::AddedTokenMatcher::Segment> segs;
  raw_matcher_.split(text, segs);
  for (const auto& s : segs) {
    if (s.token) {
      ids.push_back(s.token->id);
    } else {
      encode_section(text.substr(s.begin, s.end - s.begin), s.begin == 0, ids);
    }
  }
  return ids;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> body = encode_plain(text);
  if (prefix_.empty() && suffix_.empty()) return body;
  std::vector<int32_t> ids;
  ids.reserve(prefix_.size() + body.size() + suffix_.size());
  ids.insert(ids.end(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

std::string HfTokenizer::decode_raw(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    // HF skips ids it does not know.
    if (auto it = id_to_token_.find(id); it != id_to_token_.end()) tokens.push_back(it->second);
  }
  if (decoder_) {
    decoder_->decode_chain(tokens);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) out += ' ';
    out += tokens[i];
  }
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string s = decode_raw(ids);
  return clean_up_spaces_ ? clean_up_tokenization(std::move(s)) : s;
}

}  // namespace mt::data
