// SentencePiece tokenizers against the spm_encode / spm_decode command-line tools, on models
// trained here with spm_train on Brown text (a unigram model with byte fallback and a BPE model),
// over every line of the Brown corpus and of the Unicode corpus. Also Megatron's extra special
// tokens and ids for the three flavors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_tools/reference.h"

namespace mt::data {
namespace {

using testing::have_node_modules;
using testing::sh;
using testing::source_dir;
using testing::temp_path;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string l;
  while (std::getline(in, l)) lines.push_back(l);
  return lines;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream ss(line);
  int32_t v;
  while (ss >> v) ids.push_back(v);
  return ids;
}

bool has_cli() { return std::system("command -v spm_train >/dev/null && command -v spm_encode >/dev/null") == 0; }

// Trains a small model on Brown text (written by scripts/brown_to_jsonl.js) and prepares the
// corpus lines; returns the model path.
struct Fixture {
  std::string dir, model;
  std::vector<std::string> lines;
};

Fixture prepare(const std::string& type, const std::string& extra) {
  Fixture f;
  f.dir = temp_path("spm_" + type);
  std::filesystem::create_directories(f.dir);
  sh("node '" + source_dir() + "/scripts/brown_to_jsonl.js' '" + f.dir + "' >/dev/null");
  f.model = f.dir + "/m.model";
  sh("spm_train --input='" + f.dir + "/brown.txt' --model_prefix='" + f.dir + "/m' --vocab_size=3000 "
     "--model_type=" + type + " --input_sentence_size=6000 --shuffle_input_sentence=true "
     "--num_threads=2 --minloglevel=2 " + extra + " >/dev/null 2>&1");
  sh("node '" + source_dir() + "/tests/data/tokenizer_tools/reference.js' text - '" + f.dir +
     "/c' brown unicode");
  sh("cat '" + f.dir + "/c.brown.txt' '" + f.dir + "/c.unicode.txt' > '" + f.dir + "/lines.txt'");
  f.lines = read_lines(f.dir + "/lines.txt");
  return f;
}

std::unique_ptr<Tokenizer> make(const std::string& type, const std::string& model) {
  TokenizerOptions o;
  o.type = type;
  o.tokenizer_model = model;
  return build_tokenizer(o);
}

bool has_megatron_special(const std::string& s) {
  for (const char* t : {"<CLS>", "<SEP>", "<EOD>", "<MASK>", "<PAD>", "<s>", "</s>"}) {
    if (s.find(t) != std::string::npos) return true;
  }
  return false;
}

struct SpmCase {
  const char* type;
  const char* extra;  // spm_train options
};
void PrintTo(const SpmCase& c, std::ostream* os) { *os << c.type; }

class TokenizerSentencePiece : public ::testing::TestWithParam<SpmCase> {
 protected:
  void SetUp() override {
    if (!have_node_modules()) GTEST_SKIP() << "node_modules missing: run npm install";
    if (!has_cli()) GTEST_SKIP() << "spm_train/spm_encode missing: apt-get install sentencepiece";
  }
};

TEST_P(TokenizerSentencePiece, MatchesSpmEncodeOnBrownAndUnicode) {
  const auto [type, extra] = GetParam();
  const Fixture f = prepare(type, extra);
  ASSERT_GT(f.lines.size(), 30000u);
  sh("spm_encode --model='" + f.model + "' --output_format=id < '" + f.dir + "/lines.txt' > '" +
     f.dir + "/ids.txt'");
  sh("spm_decode --model='" + f.model + "' --input_format=id < '" + f.dir + "/ids.txt' > '" +
     f.dir + "/decoded.txt'");
  const auto ref = read_lines(f.dir + "/ids.txt");
  const auto decoded = read_lines(f.dir + "/decoded.txt");
  ASSERT_EQ(ref.size(), f.lines.size());
  ASSERT_EQ(decoded.size(), f.lines.size());

  auto megatron = make("SentencePieceTokenizer", f.model);
  auto gpt = make("GPTSentencePieceTokenizer", f.model);
  size_t compared = 0, bad = 0;
  for (size_t i = 0; i < f.lines.size(); ++i) {
    const auto want = parse_ids(ref[i]);
    const auto got = gpt->encode(f.lines[i]);
    compared += want.size();
    if (got != want && ++bad <= 5) ADD_FAILURE() << "line " << i << ": " << f.lines[i];
    if (!has_megatron_special(f.lines[i]) && megatron->encode(f.lines[i]) != want && ++bad <= 5) {
      ADD_FAILURE() << "SentencePieceTokenizer, line " << i << ": " << f.lines[i];
    }
    if (gpt->decode(want) != decoded[i] && ++bad <= 5) {
      ADD_FAILURE() << "decode differs from spm_decode on line " << i;
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(compared, 1000000u);
  std::printf("SentencePiece %s: %zu ids compared\n", type, compared);
  std::filesystem::remove_all(f.dir);
}

INSTANTIATE_TEST_SUITE_P(Trained, TokenizerSentencePiece,
                         ::testing::Values(SpmCase{"unigram", "--byte_fallback=true"},
                                           SpmCase{"bpe", ""}),
                         [](const auto& info) { return std::string(info.param.type); });

// Megatron's special ids and splitting, on a tiny model trained from a few lines.
class TokenizerSentencePieceSpecials : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!has_cli()) return;
    dir_ = temp_path("spm_small");
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/t.txt") << "the quick brown fox jumps over the lazy dog\n"
                                      "a stitch in time saves nine\nhello world, hello there\n";
    sh("spm_train --input='" + dir_ + "/t.txt' --model_prefix='" + dir_ +
       "/m' --vocab_size=40 --model_type=bpe --minloglevel=2 >/dev/null 2>&1");
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    if (!has_cli()) GTEST_SKIP() << "spm_train missing: apt-get install sentencepiece";
  }
  static inline std::string dir_;
};

TEST_F(TokenizerSentencePieceSpecials, MegatronIds) {
  auto meg = make("SentencePieceTokenizer", dir_ + "/m.model");
  auto gpt = make("GPTSentencePieceTokenizer", dir_ + "/m.model");
  auto llama = make("Llama2Tokenizer", dir_ + "/m.model");
  // Default spm ids: unk 0, bos 1, eos 2, no pad. Megatron appends <CLS> <SEP> <EOD> <MASK>
  // <PAD> after the 40 pieces.
  EXPECT_EQ(meg->vocab_size(), 45);
  EXPECT_EQ(meg->eod(), 42);
  EXPECT_EQ(meg->bos(), 1);
  EXPECT_EQ(meg->pad(), 44);
  EXPECT_EQ(gpt->vocab_size(), 40);
  EXPECT_EQ(gpt->eod(), 2);
  EXPECT_EQ(gpt->bos(), 1);
  EXPECT_EQ(gpt->pad(), -1);
  EXPECT_EQ(llama->eod(), 2);

  const auto hello = gpt->encode("hello");
  const auto world = gpt->encode("world");
  auto cat = [](std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> v;
    for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
  };
  // Special strings are cut out first and each piece between them is encoded on its own.
  EXPECT_EQ(meg->encode("hello<EOD>world</s>"), cat({hello, {42}, world, {2}}));
  EXPECT_EQ(meg->encode("<s>hello<MASK><PAD>"), cat({{1}, hello, {43, 44}}));
  EXPECT_EQ(meg->encode("<CLS><SEP>"), (std::vector<int32_t>{40, 41}));
  for (int32_t id : gpt->encode("hello<EOD>")) EXPECT_LT(id, 40);  // no special strings there
  EXPECT_EQ(llama->encode("hello"), cat({{1}, hello}));
  // Megatron's detokenize writes special ids as their strings between spaces.
  EXPECT_EQ(meg->decode(cat({hello, {42}, world})), "hello <EOD> world");
  EXPECT_EQ(gpt->decode(hello), "hello");
  EXPECT_EQ(llama->decode(llama->encode("hello world")), "hello world");
  EXPECT_THROW(gpt->decode({40}), mt::Error);
}

TEST(TokenizerSentencePieceFiles, ErrorsNameTheFlag) {
  for (const char* type : {"SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"}) {
    try {
      make(type, "/nonexistent.model");
      FAIL() << "expected mt::Error";
    } catch (const mt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--tokenizer-model"), std::string::npos) << e.what();
    }
  }
  const std::string bad = temp_path("not_a.model");
  std::ofstream(bad) << "this is not a protobuf";
  EXPECT_THROW(make("SentencePieceTokenizer", bad), mt::Error);
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace mt::data
