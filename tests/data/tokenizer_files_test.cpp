// Tokenizer files with hostile contents: ids that would size a table of gigabytes, ids of the
// wrong type or range, and files that are not regular files. Each is refused with the flag and
// the file named, or (sparse ids, as HF allows) loaded without a table of that size.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "core/error.h"
#include "data/reference/data_test_util.h"
#include "data/tokenizer.h"
#include "data/tokenizers/hf_tokenizer.h"

namespace mt::data {
namespace {

using testing::TempDir;

std::string tokenizer_json(const std::string& vocab, const std::string& added = "[]",
                           const std::string& post = "null") {
  return R"({"added_tokens": )" + added + R"(, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": )" + post +
         R"(, "model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": ["a b"]}})";
}

std::string hf_error(const std::string& path) {
  try {
    HfTokenizer t(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// An id near 2^31 used to resize the id -> token table to 2^31 strings (64 GB).
TEST(TokenizerFiles, SparseHfIdsNeedNoTableOfThatSize) {
  TempDir dir;
  testing::write_bytes(dir / "tokenizer.json",
                       tokenizer_json(R"({"a": 0, "b": 1, "ab": 2147483646})", R"([{"id": 2147483647, "content": "<x>"}])"));
  HfTokenizer t(dir / "tokenizer.json");
  EXPECT_EQ(t.vocab_size(), 4);
  EXPECT_EQ(t.encode("ab <x> a"), (std::vector<int32_t>{2147483646, 2147483647, 0}));
  EXPECT_EQ(t.decode({2147483646, 5, 0}), "ab a");  // unknown ids are skipped, as HF does
}

TEST(TokenizerFiles, HfIdsOutOfRangeOrOfTheWrongTypeAreRefused) {
  TempDir dir;
  const std::string f = dir / "tokenizer.json";
  const std::string vocab = R"({"a": 0, "b": 1, "ab": 2})";
  testing::write_bytes(f, tokenizer_json(vocab, R"([{"id": 1099511627776, "content": "<x>"}])"));
  EXPECT_NE(hf_error(f).find("added_tokens[0]: added token without a valid id"), std::string::npos) << hf_error(f);
  testing::write_bytes(f, tokenizer_json(vocab, "[]",
                                         R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                                             {"Sequence": {"id": "A"}}], "special_tokens": {"<s>": {"ids": [1e30]}}})"));
  EXPECT_NE(hf_error(f).find("token id 1e+30 is not an integer in [0, 2^31)"), std::string::npos) << hf_error(f);
  testing::write_bytes(f, tokenizer_json(vocab, "[]", R"({"type": "BertProcessing", "cls": ["a", 4294967296], "sep": ["b", 1]})"));
  EXPECT_NE(hf_error(f).find("token id 4294967296 is not an integer"), std::string::npos) << hf_error(f);
  EXPECT_NE(hf_error(f).find("tokenizer.json: post_processor"), std::string::npos) << hf_error(f);
}

TEST(TokenizerFiles, Gpt2IdsMustBeWithinTheVocabulary) {
  TempDir dir;
  testing::write_bytes(dir / "encoder.json", R"({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 1073741823})");
  testing::write_bytes(dir / "vocab.bpe", "#version: 0.2\na b\n");
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = dir / "encoder.json";
  o.merge_file = dir / "vocab.bpe";
  try {
    build_tokenizer(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-file " + o.vocab_file + ": id of '<|endoftext|>' is not an integer in [0, 4)"),
              std::string::npos) << e.what();
  }
  testing::write_bytes(dir / "encoder.json", R"({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3})");
  EXPECT_EQ(build_tokenizer(o)->vocab_size(), 4);
}

TEST(TokenizerFiles, NonRegularFilesAreRefused) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  EXPECT_NE(hf_error(dir / "pipe").find("--tokenizer-model: '" + dir / "pipe" + "' is not a regular file"),
            std::string::npos);
  // A directory whose tokenizer.json is a FIFO.
  ASSERT_EQ(::mkfifo((dir / "tokenizer.json").c_str(), 0600), 0);
  EXPECT_NE(hf_error(dir.path()).find("is not a regular file"), std::string::npos);
  TokenizerOptions o;
  o.type = "SentencePieceTokenizer";
  o.tokenizer_model = dir / "pipe";
  EXPECT_THROW(build_tokenizer(o), Error);
}

}  // namespace
}  // namespace mt::data
