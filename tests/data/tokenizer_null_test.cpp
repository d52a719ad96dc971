// NullTokenizer (Megatron semantics) and the --tokenizer-type factory's errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mt::data {
namespace {

std::unique_ptr<Tokenizer> null_tok(int64_t n) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = n;
  return build_tokenizer(o);
}

TEST(TokenizerNull, IdsAreTheIntegersInTheText) {
  auto tok = null_tok(1000);
  EXPECT_EQ(tok->vocab_size(), 1001);  // the EOD id is inside the table
  EXPECT_EQ(tok->eod(), 1000);
  EXPECT_EQ(tok->bos(), -1);
  EXPECT_EQ(tok->pad(), -1);
  EXPECT_EQ(tok->name(), "NullTokenizer");
  EXPECT_EQ(tok->encode("1 2 3 999"), (std::vector<int32_t>{1, 2, 3, 999}));
  EXPECT_EQ(tok->encode(" 7\t8\n9  "), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(tok->encode("1000"), (std::vector<int32_t>{1000}));
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_EQ(tok->decode({4, 5, 6}), "4 5 6");
  EXPECT_EQ(tok->decode(tok->encode("10 20 30")), "10 20 30");
}

TEST(TokenizerNull, BadInputNamesTheFix) {
  auto tok = null_tok(10);
  EXPECT_THROW(tok->encode("1 two 3"), mt::Error);
  EXPECT_THROW(tok->encode("11"), mt::Error);
  EXPECT_THROW(tok->encode("-1"), mt::Error);
  try {
    null_tok(0);
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-size"), std::string::npos) << e.what();
  }
}

TEST(TokenizerFactory, UnknownTypeListsTheValidOnes) {
  TokenizerOptions o;
  o.type = "BertWordPieceCase";
  try {
    build_tokenizer(o);
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--tokenizer-type BertWordPieceCase"), std::string::npos) << msg;
    for (const char* t : {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer",
                          "NullTokenizer"}) {
      EXPECT_NE(msg.find(t), std::string::npos) << msg;
    }
  }
  o.type = "";
  EXPECT_THROW(build_tokenizer(o), mt::Error);
}

}  // namespace
}  // namespace mt::data
