// `megatron preprocess`: byte-identical output to a Python reference of Megatron's
// tools/preprocess_data.py, independent of --workers, gz and glob inputs, partition order,
// malformed lines (file:line errors or skipping), and clean failure.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/preprocess_pipeline.h"
#include "data/reference/data_test_util.h"

namespace mt::data {
namespace {

using testing::TempDir;

std::string error_of(const std::vector<std::string>& args) {
  try {
    preprocess_main(args);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A varied corpus: plain texts, empty and blank texts, lists of sentences (with empty ones),
// a second key, unicode and escapes in other fields.
std::string corpus(int n, uint32_t seed, int vocab = 1000) {
  std::mt19937 g(seed);
  auto ids = [&](int count) {
    std::string s;
    for (int i = 0; i < count; ++i) {
      if (i) s += ' ';
      s += std::to_string(g() % static_cast<uint32_t>(vocab));
    }
    return s;
  };
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int kind = static_cast<int>(g() % 10);
    std::string text;
    if (kind == 0) text = "\"\"";
    else if (kind == 1) text = "\"  \"";
    else if (kind == 2) text = "[\"" + ids(3) + "\", \"\", \"" + ids(1 + static_cast<int>(g() % 5)) + "\"]";
    else text = "\"" + ids(1 + static_cast<int>(g() % 40)) + "\"";
    out += "{\"id\": " + std::to_string(i) + ", \"text\": " + text + ", \"title\": \"" + ids(static_cast<int>(g() % 4)) +
           "\", \"meta\": \"caf\\u00e9 \\\"q\\\"\"}\n";
  }
  return out;
}

void gzip_file(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), static_cast<unsigned>(data.size())), static_cast<int>(data.size()));
  gzclose(f);
}

void expect_same_dataset(const std::string& a, const std::string& b) {
  EXPECT_EQ(testing::read_bytes(a + ".idx"), testing::read_bytes(b + ".idx")) << a << " vs " << b;
  EXPECT_EQ(testing::read_bytes(a + ".bin"), testing::read_bytes(b + ".bin")) << a << " vs " << b;
}

class Preprocess : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::have_python()) GTEST_SKIP() << "/usr/bin/python3 not found: no reference to compare with";
  }
  // Runs the Python reference with the same flags.
  void reference(const std::string& inputs, const std::string& out, const std::string& flags) {
    testing::run_reference("preprocess_reference.py", "--input " + inputs + " --output-prefix " + out + " " + flags);
  }
  TempDir dir_;
};

TEST_F(Preprocess, MatchesMegatronBytes) {
  testing::write_bytes(dir_ / "in.jsonl", corpus(300, 1));
  ASSERT_EQ(preprocess_main({"--input", dir_ / "in.jsonl", "--output-prefix", dir_ / "out", "--json-keys", "text",
                             "title", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--append-eod",
                             "--workers", "2", "--log-interval", "100"}),
            0);
  reference(dir_ / "in.jsonl", dir_ / "ref", "--json-keys text title --vocab-size 1000 --append-eod");
  expect_same_dataset(dir_ / "out_text_document", dir_ / "ref_text_document");
  expect_same_dataset(dir_ / "out_title_document", dir_ / "ref_title_document");
  IndexedDataset ds(dir_ / "out_text_document");
  EXPECT_EQ(ds.num_documents(), 300);  // empty documents are kept as documents without sequences
  EXPECT_EQ(ds.dtype(), DType::U16);
}

TEST_F(Preprocess, OutputDoesNotDependOnWorkers) {
  testing::write_bytes(dir_ / "in.jsonl", corpus(3000, 2));
  reference(dir_ / "in.jsonl", dir_ / "ref", "--vocab-size 1000");
  for (const char* w : {"1", "3", "8"}) {
    SCOPED_TRACE(w);
    const std::string out = dir_ / (std::string("w") + w);
    ASSERT_EQ(preprocess_main({"--input", dir_ / "in.jsonl", "--output-prefix", out, "--tokenizer-type",
                               "NullTokenizer", "--vocab-size", "1000", "--workers", w, "--log-interval", "100000"}),
              0);
    expect_same_dataset(out + "_text_document", dir_ / "ref_text_document");
  }
}

TEST_F(Preprocess, PartitionsFollowMegatronOrder) {
  testing::write_bytes(dir_ / "in.jsonl", corpus(101, 3));
  ASSERT_EQ(preprocess_main({"--input", dir_ / "in.jsonl", "--output-prefix", dir_ / "p", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "1000", "--partitions", "3", "--append-eod"}),
            0);
  reference(dir_ / "in.jsonl", dir_ / "ref", "--vocab-size 1000 --partitions 3 --append-eod");
  expect_same_dataset(dir_ / "p_text_document", dir_ / "ref_text_document");
  // Partition files are intermediate and removed.
  for (const auto& f : testing::list_dir(dir_.path())) EXPECT_EQ(f.find("partition"), std::string::npos) << f;

  ASSERT_EQ(preprocess_main({"--input", dir_ / "in.jsonl", "--output-prefix", dir_ / "s", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "1000", "--partitions", "3",
                             "--keep-sequential-samples", "--append-eod"}),
            0);
  reference(dir_ / "in.jsonl", dir_ / "seq", "--vocab-size 1000 --append-eod");
  expect_same_dataset(dir_ / "s_text_document", dir_ / "seq_text_document");
}

TEST_F(Preprocess, GzipAndGlobInputs) {
  std::filesystem::create_directory(dir_ / "in");
  testing::write_bytes(dir_ / "in/b.jsonl", corpus(50, 4));
  gzip_file(dir_ / "in/a.jsonl.gz", corpus(70, 5));
  gzip_file(dir_ / "in/c.jsonl.gz", corpus(30, 6));
  ASSERT_EQ(preprocess_main({"--input", dir_ / "in/*.jsonl*", "--output-prefix", dir_ / "out", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "1000", "--partitions", "2"}),
            0);
  reference(testing::quote(dir_ / "in/*.jsonl*"), dir_ / "ref", "--vocab-size 1000 --partitions 2");
  expect_same_dataset(dir_ / "out_text_document", dir_ / "ref_text_document");
  EXPECT_EQ(IndexedDataset(dir_ / "out_text_document").num_documents(), 150);
}

TEST_F(Preprocess, LargeVocabularyWritesInt32) {
  testing::write_bytes(dir_ / "in.jsonl", corpus(40, 7, 70000));
  ASSERT_EQ(preprocess_main({"--input", dir_ / "in.jsonl", "--output-prefix", dir_ / "out", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "70000", "--append-eod"}),
            0);
  reference(dir_ / "in.jsonl", dir_ / "ref", "--vocab-size 70000 --append-eod");
  expect_same_dataset(dir_ / "out_text_document", dir_ / "ref_text_document");
  EXPECT_EQ(IndexedDataset(dir_ / "out_text_document").dtype(), DType::I32);
}

TEST_F(Preprocess, SkipsMalformedLinesWhenAsked) {
  const std::string good = corpus(20, 8);
  std::string bad;
  int n = 0;
  for (size_t p = 0, q; (q = good.find('\n', p)) != std::string::npos; p = q + 1) {
    bad += good.substr(p, q - p + 1);
    if (++n % 5 == 0) bad += "{\"text\": 12}\n{not json\n\n[1, 2]\n{\"other\": \"1 2\"}\n{\"text\": [\"1\", 2]}\n";
  }
  testing::write_bytes(dir_ / "bad.jsonl", bad);
  testing::write_bytes(dir_ / "good.jsonl", good);
  ASSERT_EQ(preprocess_main({"--input", dir_ / "bad.jsonl", "--output-prefix", dir_ / "out", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "1000", "--skip-malformed-lines", "--workers", "3"}),
            0);
  reference(dir_ / "good.jsonl", dir_ / "ref", "--vocab-size 1000");
  expect_same_dataset(dir_ / "out_text_document", dir_ / "ref_text_document");
}

TEST(PreprocessErrors, MalformedLineNamesFileAndLine) {
  TempDir dir;
  testing::write_bytes(dir / "in.jsonl", "{\"text\": \"1 2\"}\n{\"text\": \"3\"}\n{\"text\": \"4\"\n{\"text\": \"5\"}\n");
  const std::string e = error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "out", "--tokenizer-type",
                                  "NullTokenizer", "--vocab-size", "10"});
  EXPECT_NE(e.find("in.jsonl:3"), std::string::npos) << e;
  EXPECT_NE(e.find("--skip-malformed-lines"), std::string::npos) << e;
  // A failed run leaves nothing that looks like output (and no temporaries).
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"in.jsonl"});
}

TEST(PreprocessErrors, MissingKeyAndWrongTypeAreReported) {
  TempDir dir;
  testing::write_bytes(dir / "in.jsonl", "{\"text\": \"1\"}\n{\"body\": \"1\"}\n");
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", "10"})
                .find("in.jsonl:2: no key 'text'"),
            std::string::npos);
  testing::write_bytes(dir / "in.jsonl", "{\"text\": 5}\n");
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", "10"})
                .find("in.jsonl:1: key 'text' is not a string"),
            std::string::npos);
}

TEST(PreprocessErrors, TokenizerFailureDeepInTheInputStopsCleanly) {
  TempDir dir;
  std::string in;
  for (int i = 1; i <= 20000; ++i) in += i == 15001 ? "{\"text\": \"1 two 3\"}\n" : "{\"text\": \"1 2 3 4 5\"}\n";
  testing::write_bytes(dir / "in.jsonl", in);
  for (const char* w : {"1", "4"}) {
    const std::string e = error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "out", "--tokenizer-type",
                                    "NullTokenizer", "--vocab-size", "10", "--workers", w});
    EXPECT_NE(e.find("in.jsonl:15001: tokenizer"), std::string::npos) << e;
    EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"in.jsonl"});
  }
}

TEST(PreprocessErrors, FlagsAreChecked) {
  TempDir dir;
  testing::write_bytes(dir / "in.jsonl", "{\"text\": \"1\"}\n");
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefx", dir / "o"}).find("did you mean --output-prefix"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o"}).find("--tokenizer-type is required"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "missing.jsonl", "--output-prefix", dir / "o", "--tokenizer-type",
                      "NullTokenizer", "--vocab-size", "10"})
                .find("missing.jsonl"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "*.json", "--output-prefix", dir / "o", "--tokenizer-type", "NullTokenizer",
                      "--vocab-size", "10"})
                .find("matches no files"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "nodir/o", "--tokenizer-type",
                      "NullTokenizer", "--vocab-size", "10"})
                .find("does not exist"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--split-sentences"})
                .find("not supported"),
            std::string::npos);
  EXPECT_NE(error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--workers", "0"}).find("--workers"),
            std::string::npos);
  EXPECT_EQ(preprocess_main({"--help"}), 0);
}

TEST(PreprocessErrors, CorruptGzipIsNamed) {
  TempDir dir;
  gzip_file(dir / "in.jsonl.gz", corpus(2000, 9));
  const std::string gz = testing::read_bytes(dir / "in.jsonl.gz");
  testing::write_bytes(dir / "in.jsonl.gz", gz.substr(0, gz.size() / 2));
  const std::string e = error_of({"--input", dir / "in.jsonl.gz", "--output-prefix", dir / "out", "--tokenizer-type",
                                  "NullTokenizer", "--vocab-size", "1000"});
  EXPECT_NE(e.find("in.jsonl.gz: corrupt or truncated gzip data at line "), std::string::npos) << e;
  // The lines before the damage were read: the line named is past the first buffer's worth
  // (it used to say "after line 0").
  const int64_t line = std::stoll(e.substr(e.find("at line ") + 8));
  EXPECT_GT(line, 100) << e;
  EXPECT_LE(line, 2000) << e;
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"in.jsonl.gz"});
}

// Two gzip members (as `cat a.gz b.gz` makes): the first intact with 1000 lines, the second cut
// after its header or broken in its first block. The damage is exactly at line 1001.
TEST(PreprocessErrors, GzipDamageNamesTheLine) {
  TempDir dir;
  gzip_file(dir / "a.gz", corpus(1000, 3));
  gzip_file(dir / "b.gz", corpus(10, 4));
  const std::string first = testing::read_bytes(dir / "a.gz"), second = testing::read_bytes(dir / "b.gz");
  std::filesystem::remove(dir / "a.gz");
  std::filesystem::remove(dir / "b.gz");
  auto run = [&] {
    return error_of({"--input", dir / "in.jsonl.gz", "--output-prefix", dir / "out", "--tokenizer-type",
                     "NullTokenizer", "--vocab-size", "1000"});
  };
  testing::write_bytes(dir / "in.jsonl.gz", first + second.substr(0, 10));
  std::string e = run();
  EXPECT_NE(e.find("in.jsonl.gz: corrupt or truncated gzip data at line 1001 (unexpected end of file"),
            std::string::npos) << e;
  // Block type 3 does not exist in deflate.
  testing::write_bytes(dir / "in.jsonl.gz", first + second.substr(0, 10) + "\x07" + second.substr(11));
  e = run();
  EXPECT_NE(e.find("in.jsonl.gz: corrupt or truncated gzip data at line 1001 (invalid block type)"),
            std::string::npos) << e;
  testing::write_bytes(dir / "in.jsonl.gz", "not gzip\n");
  EXPECT_NE(run().find("at line 1 (not gzip data"), std::string::npos);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"in.jsonl.gz"});

  // Intact members (and zero padding after them) read as one text.
  testing::write_bytes(dir / "in.jsonl.gz", first + second + std::string(7, '\0'));
  testing::write_bytes(dir / "plain.jsonl", corpus(1000, 3) + corpus(10, 4));
  for (const char* in : {"in.jsonl.gz", "plain.jsonl"}) {
    EXPECT_EQ(preprocess_main({"--input", dir / in, "--output-prefix", dir / in, "--tokenizer-type",
                               "NullTokenizer", "--vocab-size", "1000"}),
              0);
  }
  expect_same_dataset(dir / "in.jsonl.gz_text_document", dir / "plain.jsonl_text_document");
}

// Inputs that would block or never end are refused by name; '-' (stdin) is not an input, as in
// Megatron's tools/preprocess_data.py.
TEST(PreprocessErrors, NonRegularInputsAreRefused) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe.jsonl").c_str(), 0600), 0);
  for (const std::string& in : {dir / "pipe.jsonl", std::string("/dev/zero"), dir.path(), std::string("-")}) {
    const std::string e = error_of({"--input", in, "--output-prefix", dir / "out", "--tokenizer-type",
                                    "NullTokenizer", "--vocab-size", "10"});
    EXPECT_NE(e.find("--input"), std::string::npos) << e;
    EXPECT_NE(e.find(in), std::string::npos) << e;
  }
  EXPECT_NE(error_of({"--input", dir / "pipe.jsonl", "--output-prefix", dir / "out", "--tokenizer-type",
                      "HuggingFaceTokenizer", "--tokenizer-model", dir / "pipe.jsonl"})
                .find("not a regular file"),
            std::string::npos);
}

// Counts are parsed as 64-bit values and bounded before use (they used to be narrowed to int:
// 99999999999 became 1215752191 workers).
TEST(PreprocessErrors, WorkerAndPartitionCountsAreBounded) {
  TempDir dir;
  testing::write_bytes(dir / "in.jsonl", "{\"text\": \"1\"}\n");
  auto err = [&](const char* flag, const char* v) {
    return error_of({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--tokenizer-type", "NullTokenizer",
                     "--vocab-size", "10", flag, v});
  };
  const std::string too_many = std::to_string(4 * std::max(1u, std::thread::hardware_concurrency()) + 1);
  for (const std::string& v : {std::string("10000"), std::string("99999999999"), too_many}) {
    const std::string e = err("--workers", v.c_str());
    EXPECT_NE(e.find("--workers " + v + " is more than 4 per hardware thread"), std::string::npos) << e;
  }
  EXPECT_NE(err("--workers", "99999999999999999999999").find("--workers 99999999999999999999999 is out of range"),
            std::string::npos);
  EXPECT_NE(err("--partitions", "99999999999").find("--partitions 99999999999 is above the limit of 256"),
            std::string::npos);
  EXPECT_NE(err("--partitions", "-2").find("--partitions expects an integer >= 1"), std::string::npos);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"in.jsonl"});
  const std::string most = std::to_string(4 * std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(preprocess_main({"--input", dir / "in.jsonl", "--output-prefix", dir / "o", "--tokenizer-type",
                             "NullTokenizer", "--vocab-size", "10", "--workers", most, "--partitions", "256"}),
            0);
}

// An encoder that fails hard (not a malformed line) on one batch, optionally slowly.
class ThrowingEncoder final : public BatchEncoder {
 public:
  explicit ThrowingEncoder(int64_t bad) : bad_(bad) {}
  EncodedBatch encode(const LineBatch& b) override {
    if (b.seq == bad_) throw std::runtime_error("encoder exploded");
    EncodedBatch out;
    out.errors.assign(b.lines.size(), "");
    return out;
  }

 private:
  int64_t bad_;
};

TEST(PreprocessPipeline, AWorkerExceptionStopsEverythingAndPropagates) {
  TempDir dir;
  std::string in;
  for (int i = 0; i < 50000; ++i) in += "{}\n";
  testing::write_bytes(dir / "in.jsonl", in);
  for (int workers : {1, 3}) {
    PipelineOptions po;
    po.workers = workers;
    po.batch_lines = 100;
    int64_t delivered = 0;
    try {
      run_pipeline({dir / "in.jsonl"}, po, [] { return std::make_unique<ThrowingEncoder>(17); },
                   [&](EncodedBatch& b) { delivered = b.seq + 1; });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "encoder exploded");
    }
    EXPECT_LE(delivered, 17);
  }
  // A failing sink stops the workers too.
  PipelineOptions po;
  po.workers = 2;
  po.batch_lines = 10;
  EXPECT_THROW(run_pipeline({dir / "in.jsonl"}, po, [] { return std::make_unique<ThrowingEncoder>(-1); },
                            [](EncodedBatch& b) {
                              if (b.seq == 5) fail("sink failed");
                            }),
               Error);
}

// A worker that runs out of memory is reported with the lines it was encoding, as mt::Error.
TEST(PreprocessPipeline, AWorkerOutOfMemoryNamesItsLines) {
  TempDir dir;
  std::string in;
  for (int i = 0; i < 1000; ++i) in += "{}\n";
  testing::write_bytes(dir / "in.jsonl", in);
  struct Hungry final : BatchEncoder {
    EncodedBatch encode(const LineBatch& b) override {
      if (b.seq == 3) throw std::bad_alloc();
      EncodedBatch out;
      out.errors.assign(b.lines.size(), "");
      return out;
    }
  };
  PipelineOptions po;
  po.workers = 2;
  po.batch_lines = 100;
  try {
    run_pipeline({dir / "in.jsonl"}, po, [] { return std::make_unique<Hungry>(); }, [](EncodedBatch&) {});
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in.jsonl: ran out of memory encoding lines 301-400"), std::string::npos)
        << e.what();
  }
}

TEST(PreprocessPipeline, InFlightBatchesAreBoundedAndOrdered) {
  TempDir dir;
  std::string in;
  for (int i = 0; i < 20000; ++i) in += "{}\n";
  testing::write_bytes(dir / "in.jsonl", in);
  PipelineOptions po;
  po.workers = 3;
  po.batch_lines = 100;
  std::atomic<int64_t> consumed{0}, max_ahead{0};
  auto make = [&] {
    struct Watch final : BatchEncoder {
      std::atomic<int64_t>& consumed;
      std::atomic<int64_t>& max_ahead;
      Watch(std::atomic<int64_t>& c, std::atomic<int64_t>& m) : consumed(c), max_ahead(m) {}
      EncodedBatch encode(const LineBatch& b) override {
        int64_t ahead = b.seq - consumed.load();
        int64_t m = max_ahead.load();
        while (ahead > m && !max_ahead.compare_exchange_weak(m, ahead)) {
        }
        EncodedBatch out;
        out.errors.assign(b.lines.size(), "");
        return out;
      }
    };
    return std::unique_ptr<BatchEncoder>(std::make_unique<Watch>(consumed, max_ahead));
  };
  int64_t expect = 0, lines = 0;
  run_pipeline({dir / "in.jsonl"}, po, make, [&](EncodedBatch& b) {
    EXPECT_EQ(b.seq, expect++);
    EXPECT_EQ(b.first_global, lines);
    lines += static_cast<int64_t>(b.errors.size());
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a slow writer
    consumed = b.seq + 1;
  });
  EXPECT_EQ(lines, 20000);
  EXPECT_LE(max_ahead.load(), 2 * po.workers + 2);
}

}  // namespace
}  // namespace mt::data
