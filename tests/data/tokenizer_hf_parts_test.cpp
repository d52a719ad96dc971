// HuggingFaceTokenizer's components on small hand-written tokenizer.json pieces, for the options
// the real files of the other test do not use: Split behaviors and invert, Metaspace, Digits,
// normalizers, decoders, added-token options, BPE options and the post-processor/config rules.
// Expected values follow HF tokenizers (Rust) and transformers.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "data/tokenizer_tools/reference.h"
#include "data/tokenizers/hf_decoder.h"
#include "data/tokenizers/hf_normalizer.h"
#include "data/tokenizers/hf_pre_tokenizer.h"
#include "data/tokenizers/hf_tokenizer.h"

namespace mt::data {
namespace {

using nlohmann::json;
using Strings = std::vector<std::string>;

const hf::Where kWhere{"test.json", "x"};

Strings pre_tokenize(const std::string& cfg, const std::string& text, bool first = true) {
  auto p = hf::make_pre_tokenizer(json::parse(cfg), kWhere);
  hf::PreTokenized pt;
  pt.buf = text;
  pt.pieces.assign(1, {0, text.size()});
  pt.first_section = first;
  p->apply(pt);
  Strings out;
  for (size_t i = 0; i < pt.pieces.size(); ++i) out.emplace_back(pt.piece(i));
  return out;
}

std::string split_cfg(const std::string& behavior, bool invert, const std::string& pattern = R"({"String": "-"})") {
  return R"({"type": "Split", "pattern": )" + pattern + R"(, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

TEST(TokenizerHfParts, SplitBehaviors) {
  const std::string t = "a-b--c-";
  EXPECT_EQ(pre_tokenize(split_cfg("Removed", false), t), (Strings{"a", "b", "c"}));
  EXPECT_EQ(pre_tokenize(split_cfg("Isolated", false), t), (Strings{"a", "-", "b", "-", "-", "c", "-"}));
  EXPECT_EQ(pre_tokenize(split_cfg("MergedWithPrevious", false), t), (Strings{"a-", "b-", "-", "c-"}));
  EXPECT_EQ(pre_tokenize(split_cfg("MergedWithNext", false), t), (Strings{"a", "-b", "-", "-c", "-"}));
  EXPECT_EQ(pre_tokenize(split_cfg("Contiguous", false), t), (Strings{"a", "-", "b", "--", "c", "-"}));
  // invert: the pattern marks what to keep, the gaps are the delimiters.
  EXPECT_EQ(pre_tokenize(split_cfg("Removed", true, R"({"Regex": "[a-z]+"})"), "ab, cd!"),
            (Strings{"ab", "cd"}));
  EXPECT_EQ(pre_tokenize(split_cfg("Isolated", false, R"({"Regex": "\\s+"})"), "x  y\tz"),
            (Strings{"x", "  ", "y", "\t", "z"}));
}

TEST(TokenizerHfParts, MetaspaceDigitsByteLevel) {
  const std::string m = "\xE2\x96\x81";  // ▁
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true})",
                         "hello  world"),
            (Strings{m + "hello", m, m + "world"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})",
                         "a b", false),
            (Strings{"a" + m + "b"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})",
                         "a b", true),
            (Strings{m + "a" + m + "b"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})", " a"),
            (Strings{m + "a"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": true})", "ab123c4"),
            (Strings{"ab", "1", "2", "3", "c", "4"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Digits", "individual_digits": false})", "ab123c4"),
            (Strings{"ab", "123", "c", "4"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})",
                         "Hello world's"),
            (Strings{" Hello", " world", "'s"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})", "a b"),
            (Strings{"a b"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "WhitespaceSplit"})", " a  b\n"), (Strings{"a", "b"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Whitespace"})", "it's ok"), (Strings{"it", "'", "s", "ok"}));
  EXPECT_EQ(pre_tokenize(R"({"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Punctuation"}]})",
                         "hi, you!"),
            (Strings{"hi", ",", "you", "!"}));
  EXPECT_THROW(hf::make_pre_tokenizer(json::parse(R"({"type": "UnicodeScripts"})"), kWhere), mt::Error);
}

std::string normalize(const std::string& cfg, std::string s) {
  hf::make_normalizer(json::parse(cfg), kWhere)->normalize(s);
  return s;
}

TEST(TokenizerHfParts, Normalizers) {
  EXPECT_EQ(normalize(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})", "a b"),
            "\xE2\x96\x81" "a\xE2\x96\x81" "b");
  EXPECT_EQ(normalize(R"({"type": "Prepend", "prepend": "_"})", ""), "");
  EXPECT_EQ(normalize(R"({"type": "NFC"})", "e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(normalize(R"({"type": "NFKD"})", "\xEF\xAC\x81"), "fi");
  EXPECT_EQ(normalize(R"({"type": "Lowercase"})", "HeLLo \xC3\x89"), "hello \xC3\xA9");
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": true, "strip_right": false})", "  a b  "), "a b  ");
  EXPECT_EQ(normalize(R"({"type": "Strip", "strip_left": true, "strip_right": true})", "\t a \n"), "a");
  EXPECT_EQ(normalize(R"({"type": "StripAccents"})", "e\xCC\x81t\xC3\xA9"), "et\xC3\xA9");
  EXPECT_EQ(normalize(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})", "a \t\n b"), "a b");
  EXPECT_THROW(hf::make_normalizer(json::parse(R"({"type": "Precompiled"})"), kWhere), mt::Error);
}

Strings decode(const std::string& cfg, Strings tokens) {
  hf::make_decoder(json::parse(cfg), kWhere)->decode_chain(tokens);
  return tokens;
}

TEST(TokenizerHfParts, Decoders) {
  EXPECT_EQ(decode(R"({"type": "ByteFallback"})", {"<0xE4>", "<0xB8>", "<0xAD>", "a", "<0xE4>", "b"}),
            (Strings{"\xE4\xB8\xAD", "a", "\xEF\xBF\xBD", "b"}));
  EXPECT_EQ(decode(R"({"type": "ByteFallback"})", {"<0xE4>", "<0xB8>"}),
            (Strings{"\xEF\xBF\xBD", "\xEF\xBF\xBD"}));  // one replacement per byte, as HF
  EXPECT_EQ(decode(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"})",
                   {"\xE2\x96\x81hello", "\xE2\x96\x81world"}),
            (Strings{"hello", " world"}));
  EXPECT_EQ(decode(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})",
                   {"\xE2\x96\x81hello"}),
            (Strings{" hello"}));
  EXPECT_EQ(decode(R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 1}]})",
                   {"\xE2\x96\x81\xE2\x96\x81" "a", "b\xE2\x96\x81"}),
            (Strings{" ab"}));
  EXPECT_EQ(decode(R"({"type": "ByteLevel"})", {"Hello", "\xC4\xA0world", "<|x y|>"}),
            (Strings{"Hello world<|x y|>"}));
  EXPECT_THROW(hf::make_decoder(json::parse(R"({"type": "WordPiece"})"), kWhere), mt::Error);
}

// A tiny tokenizer.json written to a temporary directory.
class TinyTokenizer {
 public:
  explicit TinyTokenizer(json tok, json cfg = nullptr)
      : dir_(testing::temp_path("tiny" + std::to_string(counter_++))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/tokenizer.json") << tok.dump();
    if (!cfg.is_null()) std::ofstream(dir_ + "/tokenizer_config.json") << cfg.dump();
    try {
      tok_ = std::make_unique<HfTokenizer>(dir_);
    } catch (...) {
      std::filesystem::remove_all(dir_);
      throw;
    }
  }
  ~TinyTokenizer() { std::filesystem::remove_all(dir_); }
  HfTokenizer& operator*() { return *tok_; }
  HfTokenizer* operator->() { return tok_.get(); }

 private:
  static inline int counter_ = 0;
  std::string dir_;
  std::unique_ptr<HfTokenizer> tok_;
};

// Characters a-e, space-marker words, and merges "a b" -> ab, "ab c" -> abc.
json tiny_model(json extra = json::object()) {
  json vocab = {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"ab", 5}, {"abc", 6},
                {"\xE2\x96\x81", 7}, {"<0xC3>", 8}, {"<0xA9>", 9}, {"cd", 10}};
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c"}},
                {"unk_token", "<unk>"}};
  for (auto& [k, v] : extra.items()) model[k] = v;
  return model;
}

json tiny(json model, json added = json::array()) {
  return {{"version", "1.0"}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
          {"post_processor", nullptr}, {"decoder", nullptr}, {"added_tokens", added},
          {"model", model}};
}

TEST(TokenizerHfParts, BpeOptions) {
  {
    TinyTokenizer t(tiny(tiny_model()));
    EXPECT_EQ(t->encode("abcab"), (std::vector<int32_t>{6, 5}));
    EXPECT_EQ(t->encode("xyab"), (std::vector<int32_t>{0, 0, 5}));  // unk per character
  }
  {
    TinyTokenizer t(tiny(tiny_model({{"fuse_unk", true}})));
    EXPECT_EQ(t->encode("xyab"), (std::vector<int32_t>{0, 5}));
  }
  {
    TinyTokenizer t(tiny(tiny_model({{"byte_fallback", true}})));
    EXPECT_EQ(t->encode("\xC3\xA9" "a"), (std::vector<int32_t>{8, 9, 1}));  // é -> <0xC3><0xA9>
    EXPECT_EQ(t->encode("x"), (std::vector<int32_t>{0}));  // its byte is not in the vocab: unk
  }
  {
    // ignore_merges: a word found whole is one token even if the merges would not build it.
    TinyTokenizer t(tiny(tiny_model({{"ignore_merges", true}})));
    EXPECT_EQ(t->encode("cd"), (std::vector<int32_t>{10}));
    TinyTokenizer u(tiny(tiny_model()));
    EXPECT_EQ(u->encode("cd"), (std::vector<int32_t>{3, 4}));
  }
  {
    json m = tiny_model();
    m["dropout"] = 0.1;
    try {
      TinyTokenizer t(tiny(m));
      ADD_FAILURE() << "expected mt::Error";
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("dropout"), std::string::npos) << e.what();
    }
    m["dropout"] = 0.0;
    TinyTokenizer no_dropout(tiny(m));
    json w = tiny_model();
    w["merges"] = {"a z"};
    EXPECT_THROW(TinyTokenizer t(tiny(w)), mt::Error);
  }
}

TEST(TokenizerHfParts, AddedTokens) {
  json added = json::array({
      {{"id", 20}, {"content", "<x>"}, {"special", true}, {"normalized", false}},
      {{"id", 21}, {"content", "<xy>"}, {"special", true}, {"normalized", false}},
      {{"id", 22}, {"content", "[L]"}, {"special", false}, {"normalized", false}, {"lstrip", true}},
      {{"id", 23}, {"content", "[R]"}, {"special", false}, {"normalized", false}, {"rstrip", true}},
      {{"id", 24}, {"content", "dd"}, {"special", false}, {"normalized", false}, {"single_word", true}},
      {{"id", 25}, {"content", "CC"}, {"special", false}, {"normalized", true}},
  });
  json tok = tiny(tiny_model(), added);
  tok["pre_tokenizer"] = json::parse(R"({"type": "WhitespaceSplit"})");
  tok["normalizer"] = json::parse(R"({"type": "Lowercase"})");
  TinyTokenizer t(tok);
  EXPECT_EQ(t->encode("a<xy>b<x>"), (std::vector<int32_t>{1, 21, 2, 20}));  // longest match
  EXPECT_EQ(t->encode("a  [L]  b"), (std::vector<int32_t>{1, 22, 2}));
  EXPECT_EQ(t->encode("a [R]  b"), (std::vector<int32_t>{1, 23, 2}));
  EXPECT_EQ(t->encode("a dd b"), (std::vector<int32_t>{1, 24, 2}));
  EXPECT_EQ(t->encode("add"), (std::vector<int32_t>{1, 4, 4}));  // inside a word: not matched
  // "normalized" tokens are found after normalization: CC lowercases to cc, which is the token.
  EXPECT_EQ(t->encode("aCCb"), (std::vector<int32_t>{1, 25, 2}));
  EXPECT_EQ(t->vocab_size(), 11 + 6);
}

TEST(TokenizerHfParts, PostProcessorAndConfig) {
  json tok = tiny(tiny_model(), json::array({
      {{"id", 30}, {"content", "<s>"}, {"special", true}},
      {{"id", 31}, {"content", "</s>"}, {"special", true}},
  }));
  tok["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [30], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [31], "tokens": ["</s>"]}}})");
  {
    // Megatron calls tokenizer(text).input_ids: the template's special tokens are added.
    TinyTokenizer t(tok, {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"pad_token", nullptr}});
    EXPECT_EQ(t->encode("ab"), (std::vector<int32_t>{30, 5, 31}));
    EXPECT_EQ(t->encode_plain("ab"), (std::vector<int32_t>{5}));
    EXPECT_EQ(t->bos(), 30);
    EXPECT_EQ(t->eod(), 31);
    EXPECT_EQ(t->pad(), -1);
  }
  {
    // LlamaTokenizerFast rebuilds the template from add_bos_token / add_eos_token.
    TinyTokenizer t(tok, {{"tokenizer_class", "LlamaTokenizer"}, {"bos_token", "<s>"},
                          {"eos_token", "</s>"}, {"add_bos_token", false}, {"add_eos_token", true}});
    EXPECT_EQ(t->encode("ab"), (std::vector<int32_t>{5, 31}));
  }
  {
    // No tokenizer_config.json: the usual special-token names are taken.
    TinyTokenizer t(tok);
    EXPECT_EQ(t->eod(), 31);
    EXPECT_EQ(t->bos(), 30);
  }
  {
    json d = tok;
    d["decoder"] = json::parse(R"({"type": "Fuse"})");
    TinyTokenizer t(d, {{"eos_token", "</s>"}, {"clean_up_tokenization_spaces", true}});
    EXPECT_EQ(t->decode({30, 5, 31}), "<s>ab</s>");
    TinyTokenizer u(tiny(tiny_model()), {{"clean_up_tokenization_spaces", true}});
    EXPECT_EQ(u->decode({1, 3}), "a c");  // no decoder: tokens joined by spaces
  }
}

}  // namespace
}  // namespace mt::data

namespace mt::data {
namespace {

TEST(TokenizerHfParts, BadFilesGiveOneLineErrors) {
  auto expect_error = [](json tok, const std::string& needle) {
    try {
      TinyTokenizer t(tok);
      ADD_FAILURE() << "expected mt::Error mentioning " << needle;
    } catch (const mt::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--tokenizer-model"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  json unigram = tiny(tiny_model());
  unigram["model"]["type"] = "Unigram";
  expect_error(unigram, "Unigram");
  json precompiled = tiny(tiny_model());
  precompiled["normalizer"] = {{"type", "Precompiled"}};
  expect_error(precompiled, "Precompiled");
  json bad_added = tiny(tiny_model(), json::array({{{"id", "x"}, {"content", "<x>"}}}));
  expect_error(bad_added, "added_tokens[0]");
  json bad_template = tiny(tiny_model());
  bad_template["post_processor"] = json::parse(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": 5}}]})");
  expect_error(bad_template, "structure");
}

}  // namespace
}  // namespace mt::data
