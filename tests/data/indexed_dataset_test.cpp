// Indexed dataset: exact bytes, every dtype, validation of damaged files, and merging.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <limits>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/reference/data_test_util.h"

namespace mt::data {
namespace {

using testing::Docs;
using testing::TempDir;

template <typename T>
std::string le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

// Expects `f` to throw mt::Error whose message contains every needle.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(IndexedDataset, BytesMatchMegatronLayout) {
  TempDir dir;
  const std::string prefix = dir / "ds";
  testing::write_dataset(prefix, {{{1, 2, 3}}, {{4}}, {}}, DType::U16);
  std::string idx = std::string("MMIDIDX\0\0", 9) + le<uint64_t>(1) + std::string(1, '\x08') +
                    le<uint64_t>(2) + le<uint64_t>(4) + le<int32_t>(3) + le<int32_t>(1) + le<int64_t>(0) +
                    le<int64_t>(6) + le<int64_t>(0) + le<int64_t>(1) + le<int64_t>(2) + le<int64_t>(2);
  EXPECT_EQ(testing::read_bytes(prefix + ".idx"), idx);
  EXPECT_EQ(testing::read_bytes(prefix + ".bin"),
            le<uint16_t>(1) + le<uint16_t>(2) + le<uint16_t>(3) + le<uint16_t>(4));
  // Nothing else is left behind.
  EXPECT_EQ(testing::list_dir(dir.path()), (std::vector<std::string>{"ds.bin", "ds.idx"}));
}

TEST(IndexedDataset, RoundTripsEveryDtype) {
  struct Case {
    DType t;
    int64_t lo, hi;
  };
  const Case cases[] = {{DType::U8, 0, 255},           {DType::I8, -128, 127},
                        {DType::I16, -32768, 32767},   {DType::U16, 0, 65535},
                        {DType::I32, INT32_MIN, INT32_MAX}, {DType::I64, INT64_MIN / 2, INT64_MAX / 2},
                        {DType::F32, -16777216, 16777216},  {DType::F64, -(1LL << 52), 1LL << 52}};
  for (const auto& c : cases) {
    SCOPED_TRACE(dtype_name(c.t));
    TempDir dir;
    const std::string prefix = dir / "ds";
    Docs docs = {{{c.lo, c.hi, 0, 1}, {7}}, {}, {{c.hi}}, {{c.lo, 2}, {3, 4, 5}, {c.hi - 1}}};
    testing::write_dataset(prefix, docs, c.t);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), c.t);
    EXPECT_EQ(ds.num_sequences(), 6);
    EXPECT_EQ(ds.num_documents(), 4);
    EXPECT_EQ(ds.num_tokens(), 12);
    const std::vector<int64_t> bounds = {0, 2, 2, 3, 6};
    for (int64_t d = 0; d <= 4; ++d) EXPECT_EQ(ds.document_bound(d), bounds[static_cast<size_t>(d)]);
    int64_t seq = 0, ptr = 0;
    for (const auto& doc : docs) {
      for (const auto& s : doc) {
        EXPECT_EQ(ds.get(seq), s);
        EXPECT_EQ(ds.sequence_pointer(seq), ptr);
        ptr += static_cast<int64_t>(s.size() * dtype_size(c.t));
        ++seq;
      }
    }
    std::vector<int64_t> part(2);
    ds.read(4, 1, 2, part.data());
    EXPECT_EQ(part, (std::vector<int64_t>{4, 5}));
    EXPECT_EQ(std::filesystem::file_size(prefix + ".idx"), 34u + 12u * 6u + 8u * 5u);
  }
}

TEST(IndexedDataset, OptimalDtypeFollowsMegatron) {
  EXPECT_EQ(optimal_dtype(50257), DType::U16);
  EXPECT_EQ(optimal_dtype(65499), DType::U16);
  EXPECT_EQ(optimal_dtype(65500), DType::I32);
  EXPECT_EQ(optimal_dtype(128256), DType::I32);
}

TEST(IndexedDataset, TokenOutsideDtypeIsAnError) {
  TempDir dir;
  IndexedDatasetWriter w(dir / "ds", DType::U16);
  const int32_t ids[] = {1, 70000};
  expect_error([&] { w.add_item(ids, 2); }, {"70000", "uint16", "ds.bin"});
}

TEST(IndexedDataset, UnfinishedWriterLeavesNoFiles) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "ds", DType::I32);
    const int32_t ids[] = {1, 2, 3};
    w.add_item(ids, 3);
    w.end_document();
  }
  EXPECT_TRUE(testing::list_dir(dir.path()).empty());
}

class DamagedFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_ / "ds";
    testing::write_dataset(prefix_, testing::random_docs(20, 30, 1000, 1), DType::U16);
    idx_ = testing::read_bytes(prefix_ + ".idx");
    bin_ = testing::read_bytes(prefix_ + ".bin");
  }
  void open_expecting(std::initializer_list<std::string> needles) {
    expect_error([&] { IndexedDataset ds(prefix_); }, needles);
  }
  TempDir dir_;
  std::string prefix_, idx_, bin_;
};

TEST_F(DamagedFiles, MissingFiles) {
  std::filesystem::remove(prefix_ + ".bin");
  open_expecting({"ds.bin", "megatron preprocess"});
}

TEST_F(DamagedFiles, IdxShorterThanHeader) {
  testing::write_bytes(prefix_ + ".idx", idx_.substr(0, 20));
  open_expecting({"ds.idx", "truncated", "header"});
}

TEST_F(DamagedFiles, IdxTruncatedInArrays) {
  testing::write_bytes(prefix_ + ".idx", idx_.substr(0, idx_.size() - 5));
  open_expecting({"ds.idx", "truncated"});
}

TEST_F(DamagedFiles, BadMagic) {
  std::string bad = idx_;
  bad[0] = 'X';
  testing::write_bytes(prefix_ + ".idx", bad);
  open_expecting({"ds.idx", "MMIDIDX"});
}

TEST_F(DamagedFiles, BadVersion) {
  std::string bad = idx_;
  bad[9] = 2;
  testing::write_bytes(prefix_ + ".idx", bad);
  open_expecting({"ds.idx", "version 2"});
}

TEST_F(DamagedFiles, BadDtypeCode) {
  std::string bad = idx_;
  bad[17] = 9;
  testing::write_bytes(prefix_ + ".idx", bad);
  open_expecting({"ds.idx", "dtype code 9"});
}

TEST_F(DamagedFiles, HugeCountsInHeader) {
  std::string bad = idx_;
  const uint64_t huge = ~0ULL / 2;
  std::memcpy(bad.data() + 18, &huge, 8);
  testing::write_bytes(prefix_ + ".idx", bad);
  open_expecting({"ds.idx", "truncated or corrupt"});
}

TEST_F(DamagedFiles, ExtraBytes) {
  testing::write_bytes(prefix_ + ".idx", idx_ + std::string(3, '\0'));
  open_expecting({"ds.idx", "corrupt"});
}

TEST_F(DamagedFiles, DocumentBoundsOutOfOrder) {
  std::string bad = idx_;
  const int64_t seven = 7;  // the second document bound, made larger than the ones after it
  std::memcpy(bad.data() + bad.size() - 8 * 20, &seven, 8);
  const int64_t big = 15;
  std::memcpy(bad.data() + bad.size() - 8 * 19, &big, 8);
  std::memcpy(bad.data() + bad.size() - 8 * 18, &seven, 8);
  testing::write_bytes(prefix_ + ".idx", bad);
  open_expecting({"ds.idx", "document bound"});
}

TEST_F(DamagedFiles, BinTruncated) {
  testing::write_bytes(prefix_ + ".bin", bin_.substr(0, bin_.size() - 2));
  open_expecting({"ds.bin", "truncated"});
}

// Opening a FIFO waits for a writer forever and a device never ends: both are refused by name,
// as is a directory, without blocking.
TEST_F(DamagedFiles, NonRegularFilesAreRefused) {
  std::filesystem::remove(prefix_ + ".bin");
  ASSERT_EQ(::mkfifo((prefix_ + ".bin").c_str(), 0600), 0);
  open_expecting({"ds.bin", "not a regular file"});
  std::filesystem::remove(prefix_ + ".bin");
  std::filesystem::create_symlink("/dev/zero", prefix_ + ".bin");
  open_expecting({"ds.bin", "not a regular file"});
  std::filesystem::remove(prefix_ + ".bin");
  testing::write_bytes(prefix_ + ".bin", bin_);
  std::filesystem::remove(prefix_ + ".idx");
  std::filesystem::create_directory(prefix_ + ".idx");
  open_expecting({"ds.idx", "is a directory"});
  // MappedFile itself never blocks on a FIFO, whoever calls it.
  ASSERT_EQ(::mkfifo((dir_ / "pipe").c_str(), 0600), 0);
  expect_error([&] { MappedFile m(dir_ / "pipe"); }, {"pipe", "not a regular file"});
}

TEST(IndexedDataset, MergeConcatenates) {
  TempDir dir;
  const Docs a = {{{1, 2}}, {{3}, {4, 5}}}, b = {{}, {{6, 7, 8}}};
  testing::write_dataset(dir / "a", a, DType::I32);
  testing::write_dataset(dir / "b", b, DType::I32);
  Docs all = a;
  all.insert(all.end(), b.begin(), b.end());
  testing::write_dataset(dir / "expected", all, DType::I32);

  EXPECT_EQ(preprocess_main({"--merge", dir / "a", dir / "b.idx", "--output-prefix", dir / "merged"}), 0);
  EXPECT_EQ(testing::read_bytes(dir / "merged.idx"), testing::read_bytes(dir / "expected.idx"));
  EXPECT_EQ(testing::read_bytes(dir / "merged.bin"), testing::read_bytes(dir / "expected.bin"));

  // A directory stands for its datasets in sorted order (tools/merge_datasets.py --input DIR).
  TempDir out;
  EXPECT_EQ(preprocess_main({"--merge", dir.path(), "--output-prefix", out / "all"}), 0);
  IndexedDataset merged(out / "all");
  EXPECT_EQ(merged.num_documents(), 2 + 2 + 4 + 4);  // a, b, expected, merged
}

TEST(IndexedDataset, MergeRejectsMixedDtypes) {
  TempDir dir;
  testing::write_dataset(dir / "a", {{{1}}}, DType::I32);
  testing::write_dataset(dir / "b", {{{1}}}, DType::U16);
  expect_error([&] { preprocess_main({"--merge", dir / "a", dir / "b", "--output-prefix", dir / "m"}); },
               {"b", "uint16", "int32"});
  EXPECT_FALSE(std::filesystem::exists(dir / "m.idx"));
}

}  // namespace
}  // namespace mt::data
