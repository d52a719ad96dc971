// The tokenizers' Unicode pieces: normalization forms against Node's (ICU) String.normalize on
// the Unicode corpus, lowercasing, UTF-8 repair, and the pattern rewrites that give \s and \w
// the meaning they have in Oniguruma and Python's regex (where JavaScript differs).
#include <gtest/gtest.h>

#include <fstream>

#include "data/tokenizer_tools/reference.h"
#include "data/tokenizers/gpt2_bpe_tokenizer.h"
#include "data/tokenizers/regex.h"
#include "data/tokenizers/unicode_norm.h"
#include "data/tokenizers/utf8.h"

namespace mt::data {
namespace {

using testing::have_node_modules;
using testing::sh;
using testing::source_dir;
using testing::temp_path;

TEST(TokenizerUnicode, NormalizationMatchesNode) {
  if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
  const std::string prefix = temp_path("norm");
  sh("node '" + source_dir() + "/tests/data/tokenizer_tools/reference.js' norm - '" + prefix +
     "' unicode");
  std::ifstream in(prefix + ".unicode.jsonl");
  std::string line;
  size_t docs = 0, chars = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string text = j["text"];
    EXPECT_EQ(unicode_normalize(text, NormForm::NFC), j["nfc"].get<std::string>()) << text;
    EXPECT_EQ(unicode_normalize(text, NormForm::NFD), j["nfd"].get<std::string>()) << text;
    EXPECT_EQ(unicode_normalize(text, NormForm::NFKC), j["nfkc"].get<std::string>()) << text;
    EXPECT_EQ(unicode_normalize(text, NormForm::NFKD), j["nfkd"].get<std::string>()) << text;
    ++docs;
    chars += text.size();
  }
  std::filesystem::remove(prefix + ".unicode.jsonl");
  EXPECT_GT(docs, 100u);
  std::printf("normalization: %zu documents, %zu bytes, 4 forms (tables: Unicode %s)\n", docs,
              chars, unicode_norm_version());
}

TEST(TokenizerUnicode, NormalizationCases) {
  // Composition, exclusions (U+0958 stays decomposed), singletons, reordering, Hangul.
  EXPECT_EQ(unicode_normalize("e\xCC\x81", NormForm::NFC), "\xC3\xA9");
  EXPECT_EQ(unicode_normalize("\xE0\xA5\x98", NormForm::NFC), "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(unicode_normalize("\xE2\x84\xAB", NormForm::NFC), "\xC3\x85");  // angstrom sign
  EXPECT_EQ(unicode_normalize("a\xCC\x81\xCC\x96", NormForm::NFD), "a\xCC\x96\xCC\x81");
  EXPECT_EQ(unicode_normalize("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", NormForm::NFC),
            "\xEA\xB0\x81");  // L V T jamo -> one syllable
  EXPECT_EQ(unicode_normalize("\xEA\xB0\x81", NormForm::NFD), "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", NormForm::NFKC), "fi");
  EXPECT_EQ(unicode_normalize("\xEF\xAC\x81", NormForm::NFC), "\xEF\xAC\x81");
  EXPECT_EQ(unicode_normalize("plain ascii", NormForm::NFKD), "plain ascii");
  EXPECT_EQ(combining_class(0x301), 230);
  EXPECT_EQ(combining_class('a'), 0);
}

TEST(TokenizerUnicode, Lowercase) {
  EXPECT_EQ(unicode_lowercase("ABC xyz"), "abc xyz");
  EXPECT_EQ(unicode_lowercase("\xC3\x89T\xC3\x89"), "\xC3\xA9t\xC3\xA9");               // ÉTÉ
  EXPECT_EQ(unicode_lowercase("\xC4\xB0"), "i\xCC\x87");                                // İ
  EXPECT_EQ(unicode_lowercase("\xCE\xA3\xCE\xA3"), "\xCF\x83\xCF\x83");                 // ΣΣ, no final-sigma rule
  EXPECT_EQ(unicode_lowercase("\xD0\x96\xD0\x96"), "\xD0\xB6\xD0\xB6");                 // ЖЖ
}

TEST(TokenizerUnicode, Utf8Repair) {
  EXPECT_EQ(utf8::valid_prefix("abc"), 3u);
  EXPECT_EQ(utf8::valid_prefix("ab\xC3"), 2u);
  EXPECT_EQ(utf8::sanitize("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8::sanitize("\xE4\xB8"), "\xEF\xBF\xBD");         // truncated: one replacement
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8::sanitize("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

std::vector<std::string> matches(const Regex& re, std::string_view s) {
  std::vector<std::string> out;
  re.for_each_match(s, [&](size_t b, size_t e) { out.emplace_back(s.substr(b, e - b)); });
  return out;
}

TEST(TokenizerUnicode, WhitespaceIsUnicodeWhiteSpace) {
  // NEL (U+0085) is White_Space for Oniguruma and Python's regex; JavaScript disagrees, and says
  // the BOM (U+FEFF) is one instead. The tokenizers follow the Rust/Python libraries Megatron uses.
  const Regex gpt2(kGpt2Pattern, "test");
  EXPECT_EQ(matches(gpt2, "a\xC2\x85" "b"), (std::vector<std::string>{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(matches(gpt2, "a \xEF\xBB\xBF" "b"), (std::vector<std::string>{"a", " \xEF\xBB\xBF", "b"}));
  EXPECT_EQ(matches(gpt2, "x\xE1\xA0\x8E" "y"),  // U+180E is not White_Space (PCRE2's \s says so)
            (std::vector<std::string>{"x", "\xE1\xA0\x8E", "y"}));
  EXPECT_EQ(matches(gpt2, "Hello  world\n\n"),
            (std::vector<std::string>{"Hello", " ", " world", "\n\n"}));
  const Regex w("\\w+", "test");
  EXPECT_EQ(matches(w, "e\xCC\x81t\xC3\xA9_1"), (std::vector<std::string>{"e\xCC\x81t\xC3\xA9_1"}));
  EXPECT_EQ(translate_pattern("[^\\s\\p{L}]\\S"), "[^\\t-\\r\\x{85}\\p{Z}\\p{L}][^\\t-\\r\\x{85}\\p{Z}]");
  EXPECT_EQ(translate_pattern("[\\]\\s]"), "[\\]\\t-\\r\\x{85}\\p{Z}]");
}

}  // namespace
}  // namespace mt::data
