// TikTokenizer against tiktoken itself: the ids in tests/data/tiktoken/reference.json come from
// the tiktoken library's core (npm `tiktoken`, WASM) with the committed vocabulary (cl100k_base's
// first 1,900 tokens in Megatron's JSON format), Megatron's v1/v2 patterns and 100 special tokens;
// tests/data/tiktoken/make_fixture.js says how. Plus Megatron's special ids and its file checks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mt::data {
namespace {

const std::string kDir = std::string(MT_SOURCE_DIR) + "/tests/data/tiktoken";

TokenizerOptions options(const std::string& pattern = "v2", const std::string& model = kDir + "/vocab.json") {
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.tokenizer_model = model;
  o.tiktoken_pattern = pattern;
  o.tiktoken_num_special_tokens = 100;
  o.vocab_size = 2000;
  return o;
}

std::string error_of(const TokenizerOptions& o) {
  try {
    build_tokenizer(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerTikToken, MatchesTiktokenIdsForBothPatterns) {
  std::ifstream f(kDir + "/reference.json");
  const auto ref = nlohmann::json::parse(f);
  ASSERT_EQ(ref.at("vocab_size").get<int64_t>(), 2000);
  auto v1 = build_tokenizer(options("v1")), v2 = build_tokenizer(options("v2"));
  int checked = 0;
  for (const auto& c : ref.at("cases")) {
    const auto& tok = c.at("pattern") == "v1" ? v1 : v2;
    const std::string text = c.at("text");
    const auto ids = tok->encode(text);
    EXPECT_EQ(ids, c.at("ids").get<std::vector<int32_t>>()) << c.at("pattern") << ": " << text;
    EXPECT_EQ(tok->decode(ids), text);
    ++checked;
  }
  EXPECT_EQ(checked, 24);
}

TEST(TokenizerTikToken, SpecialIdsAndTokensInText) {
  auto tok = build_tokenizer(options());
  EXPECT_EQ(tok->vocab_size(), 2000);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eod(), 2);  // Megatron's eod is </s>
  EXPECT_EQ(tok->pad(), 4);
  EXPECT_EQ(tok->name(), "TikTokenizer");
  EXPECT_EQ(tok->encode("</s>"), (std::vector<int32_t>{2}));
  EXPECT_EQ(tok->encode("a<SPECIAL_99>"), (std::vector<int32_t>{100 + 'a', 99}));
  EXPECT_EQ(tok->encode("<s"), (std::vector<int32_t>{100 + '<', 100 + 's'}));  // no special: plain bytes
  EXPECT_EQ(tok->decode({1, 100 + 'h', 100 + 'i', 2}), "<s>hi</s>");
  EXPECT_TRUE(tok->encode("").empty());
  // Custom special tokens keep Megatron's required seven; ids follow their order.
  TokenizerOptions o = options();
  o.special_tokens = {"<pad>", "<unk>", "<s>", "</s>", "<mask>", "<cls>", "<sep>", "<tool>"};
  auto custom = build_tokenizer(o);
  EXPECT_EQ(custom->pad(), 0);
  EXPECT_EQ(custom->eod(), 3);
  EXPECT_EQ(custom->encode("<tool>"), (std::vector<int32_t>{7}));
  EXPECT_EQ(custom->encode("<SPECIAL_8>"), (std::vector<int32_t>{8}));
}

TEST(TokenizerTikToken, BadFlagsAndFilesAreNamed) {
  TokenizerOptions o = options("v3");
  EXPECT_NE(error_of(o).find("--tiktoken-pattern must be v1 or v2"), std::string::npos);
  o = options();
  o.special_tokens = {"<unk>", "<s>"};
  EXPECT_NE(error_of(o).find("--tokenizer-special-tokens must include </s>"), std::string::npos);
  o = options();
  o.vocab_size = 0;  // Megatron's default 131072: more than the file's 1,900 entries
  EXPECT_NE(error_of(o).find("fewer than --vocab-size (131072)"), std::string::npos) << error_of(o);
  o = options();
  o.tiktoken_num_special_tokens = 5;
  EXPECT_NE(error_of(o).find("--tiktoken-num-special-tokens (5) must be at least"), std::string::npos);
  o.tokenizer_model.clear();
  o.tiktoken_num_special_tokens = 100;
  EXPECT_NE(error_of(o).find("needs --tokenizer-model"), std::string::npos);

  const auto tmp = std::filesystem::temp_directory_path() / ("mt_tiktoken_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  auto write = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(tmp / name) << j.dump();
    return (tmp / name).string();
  };
  nlohmann::json entries = nlohmann::json::array();
  for (int i = 0; i < 300; ++i) entries.push_back({{"rank", i}, {"token_bytes", "QQ=="}, {"token_str", "A"}});
  auto small = [&](nlohmann::json e) {
    TokenizerOptions t = options("v2", write("v.json", e));
    t.vocab_size = 350;
    t.tiktoken_num_special_tokens = 50;
    return error_of(t);
  };
  EXPECT_NE(small(entries).find("entry 0 must be the single byte 0"), std::string::npos);
  EXPECT_NE(small(nlohmann::json::object()).find("expected Megatron's TikTokenizer vocabulary"), std::string::npos);
  nlohmann::json bytes = nlohmann::json::array();
  for (int i = 0; i < 256; ++i) {
    const unsigned char c = static_cast<unsigned char>(i);
    static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const std::string enc = {b64[c >> 2], b64[(c & 3) << 4], '=', '='};
    bytes.push_back({{"rank", i}, {"token_bytes", enc}, {"token_str", ""}});
  }
  nlohmann::json more = bytes;
  for (int i = 256; i < 300; ++i) more.push_back({{"rank", i}, {"token_bytes", "QUI="}, {"token_str", "AB"}});
  EXPECT_NE(small(more).find("entry 257 repeats an earlier token's bytes"), std::string::npos) << small(more);
  more = bytes;
  for (int i = 256; i < 300; ++i) more.push_back({{"rank", i + 1}, {"token_bytes", "QUI="}, {"token_str", "AB"}});
  EXPECT_NE(small(more).find("entry 256 has rank 257"), std::string::npos);
  more = bytes;
  for (int i = 256; i < 300; ++i) more.push_back({{"rank", i}, {"token_bytes", "Q!I="}, {"token_str", "AB"}});
  EXPECT_NE(small(more).find("entry 256: token_bytes is not base64"), std::string::npos);
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace mt::data
