// GPT dataset: numpy's random streams, Megatron's split arithmetic, the three indices against a
// numpy reference of Megatron's algorithm, sample contents, and the index cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "data/blended_config.h"
#include "data/gpt_dataset.h"
#include "data/gpt_dataset_md5.h"
#include "data/numpy_random.h"
#include "data/reference/data_test_util.h"
#include "data/sample_source.h"

namespace mt::data {
namespace {

using testing::TempDir;

// Values printed by numpy 1.24: RandomState(1234).shuffle(arange(20)), and
// default_rng(0).integers(1, 4096, 10, dtype=int32).
TEST(NumpyRandom, LegacyShuffleMatchesNumpy) {
  NumpyRandomState rng(1234);
  std::vector<int32_t> a(20);
  for (int i = 0; i < 20; ++i) a[static_cast<size_t>(i)] = i;
  rng.shuffle(a.data(), 20);
  EXPECT_EQ(a, (std::vector<int32_t>{3, 13, 2, 16, 14, 5, 4, 0, 8, 18, 17, 11, 10, 9, 7, 1, 19, 12, 6, 15}));
}

TEST(NumpyRandom, GeneratorIntegersMatchNumpy) {
  EXPECT_EQ(seed_sequence_state(0, 4), (std::vector<uint32_t>{2968811710u, 3677149159u, 745650761u, 2884920346u}));
  Pcg64 rng(0);
  EXPECT_EQ(numpy_integers_int32(rng, 1, 4096, 10),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));
}

TEST(NumpyRandom, ShuffleMatchesNumpyForManySeedsAndSizes) {
  if (!testing::have_numpy()) GTEST_SKIP() << "numpy not available";
  TempDir dir;
  const std::string script =
      "import numpy,sys\n"
      "for seed in (0, 1, 1234, 2**32-1):\n"
      "  for n in (1, 2, 3, 255, 256, 257, 70000):\n"
      "    a = numpy.arange(n, dtype=numpy.uint32); numpy.random.RandomState(seed).shuffle(a)\n"
      "    a.tofile(sys.argv[1] + '/%d-%d' % (seed, n))\n";
  testing::write_bytes(dir / "s.py", script);
  ASSERT_EQ(std::system(("/usr/bin/python3 " + (dir / "s.py") + " " + dir.path()).c_str()), 0);
  for (uint64_t seed : {0ULL, 1ULL, 1234ULL, 4294967295ULL}) {
    for (int n : {1, 2, 3, 255, 256, 257, 70000}) {
      std::vector<uint32_t> a(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) a[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
      NumpyRandomState rng(static_cast<uint32_t>(seed));
      rng.shuffle(a.data(), n);
      const std::string want = testing::read_bytes(dir / (std::to_string(seed) + "-" + std::to_string(n)));
      ASSERT_EQ(want.size(), a.size() * 4);
      EXPECT_EQ(std::memcmp(want.data(), a.data(), want.size()), 0) << seed << " " << n;
    }
  }
}

TEST(Md5, KnownDigests) {
  EXPECT_EQ(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(md5_hex("The quick brown fox jumps over the lazy dog"), "9e107d9d372bb6826bd81d3542a419d6");
  EXPECT_EQ(md5_hex(std::string(1000, 'a')), "cabe45dcc9ae5b66ba86600cca6b8ba8");
}

TEST(Split, ParsesAndNormalisesLikeMegatron) {
  const auto v = parse_and_normalize_split("969, 30, 1");
  EXPECT_EQ(v, (std::vector<double>{969.0 / 1000.0, 30.0 / 1000.0, 1.0 / 1000.0}));
  EXPECT_EQ(parse_and_normalize_split("99,1"), (std::vector<double>{0.99, 0.01, 0.0}));
  const SplitMatrix m = split_matrix_from_vector({0.99, 0.01, 0.0});
  ASSERT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2]);
  EXPECT_EQ(m[1]->first, 0.99);
  EXPECT_EQ(m[1]->second, 0.99 + 0.01);
  // Python's round() rounds halves to even.
  EXPECT_EQ(split_range({0.0, 0.5}, 5), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(split_range({0.5, 1.0}, 7), (std::pair<int64_t, int64_t>{4, 7}));
  EXPECT_THROW(parse_and_normalize_split("1,2,3,4"), Error);
  EXPECT_THROW(parse_and_normalize_split("0,0,0"), Error);
  EXPECT_THROW(parse_and_normalize_split("1.2.3"), Error);
}

TEST(Split, NumpySumIsPairwise) {
  // numpy.sum of [(i % 97) / 7 + (1e6 if i % 13 == 0 else 0) for i in 1..299]: numpy's pairwise
  // summation gives 23002000.571428575 where a plain loop gives 23002000.57142857.
  std::vector<double> a;
  for (int i = 1; i < 300; ++i) a.push_back((i % 97) / 7.0 + (i % 13 == 0 ? 1e6 : 0.0));
  EXPECT_EQ(numpy_sum(a.data(), a.size()), 23002000.571428575);
}

TEST(GptIndex, EpochCount) {
  EXPECT_EQ(gpt_index::num_epochs(1000, -1, 10), 1);
  EXPECT_EQ(gpt_index::num_epochs(1000, 99, 10), 1);   // needs 991 tokens
  EXPECT_EQ(gpt_index::num_epochs(1000, 100, 10), 2);  // needs 1001
  EXPECT_EQ(gpt_index::num_epochs(1000, 0, 10), 1);
}

// Flattened token stream of the documents in document-index order.
std::vector<int32_t> stream_of(const GPTDataset& ds, const IndexedDataset& data) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < ds.document_index().numel(); ++i) {
    const int64_t seq = ds.document_index().at(i);
    std::vector<int32_t> t(static_cast<size_t>(data.sequence_length(seq)));
    data.read(seq, 0, static_cast<int64_t>(t.size()), t.data());
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

void expect_same_array(const NpyArray& ours, const std::string& theirs_path) {
  const NpyArray theirs = NpyArray::load(theirs_path);
  EXPECT_EQ(ours.descr(), theirs.descr()) << theirs_path;
  ASSERT_EQ(ours.shape(), theirs.shape()) << theirs_path;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) mismatches += ours.at(i) != theirs.at(i);
  EXPECT_EQ(mismatches, 0) << theirs_path;
}

struct RefCase {
  int64_t seq;
  uint64_t seed;
  std::string split;
  std::array<int64_t, 3> sizes;
};

void PrintTo(const RefCase& c, std::ostream* os) {
  *os << "seq " << c.seq << " seed " << c.seed << " split '" << c.split << "' sizes " << c.sizes[0] << ","
      << c.sizes[1] << "," << c.sizes[2];
}

class GptReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(GptReference, IndicesMatchNumpyReference) {
  if (!testing::have_numpy()) GTEST_SKIP() << "numpy not available: no reference to compare with";
  const RefCase c = GetParam();
  TempDir dir;
  testing::write_dataset(dir / "ds", testing::random_docs(400, 150, 5000, 11), DType::U16);
  GPTDataOptions o;
  o.data_path = {dir / "ds"};
  o.split = c.split;
  o.seq_length = c.seq;
  o.seed = c.seed;
  o.data_cache_path = dir / "cache";
  SplitSources s = build_gpt_datasets(o, c.sizes.data());
  std::filesystem::create_directory(dir / "ref");
  testing::run_reference("gpt_reference.py",
                         fmt::format("--out {} --prefix {} --seq-length {} --seed {} --split '{}' --sizes {},{},{}",
                                     dir / "ref", dir / "ds", c.seq, c.seed, c.split, c.sizes[0], c.sizes[1], c.sizes[2]));
  IndexedDataset data(dir / "ds");
  const SampleSource* splits[3] = {s.train.get(), s.valid.get(), s.test.get()};
  const char* names[3] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    const std::string ref = dir / (std::string("ref/") + names[i]);
    if (!std::filesystem::exists(ref + "-document_index.npy")) {
      EXPECT_EQ(splits[i], nullptr) << names[i];
      continue;
    }
    SCOPED_TRACE(names[i]);
    const auto* ds = dynamic_cast<const GPTDataset*>(splits[i]);
    ASSERT_NE(ds, nullptr);
    EXPECT_GE(ds->size(), c.sizes[static_cast<size_t>(i)]);
    expect_same_array(ds->document_index(), ref + "-document_index.npy");
    expect_same_array(ds->sample_index(), ref + "-sample_index.npy");
    expect_same_array(ds->shuffle_index(), ref + "-shuffle_index.npy");

    // Sample j (before shuffling) is tokens [j*S, j*S + S + 1) of the document stream.
    const std::vector<int32_t> stream = stream_of(*ds, data);
    std::vector<int64_t> unshuffle(static_cast<size_t>(ds->size()));
    for (int64_t k = 0; k < ds->size(); ++k) unshuffle[static_cast<size_t>(ds->shuffle_index().at(k))] = k;
    std::vector<int32_t> tokens(static_cast<size_t>(c.seq + 1));
    for (int64_t j = 0; j < ds->size(); j += std::max<int64_t>(1, ds->size() / 50)) {
      ds->get(unshuffle[static_cast<size_t>(j)], tokens.data());
      ASSERT_TRUE(std::equal(tokens.begin(), tokens.end(), stream.begin() + j * c.seq)) << "sample " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, GptReference,
                         ::testing::Values(RefCase{64, 1234, "90,8,2", {1000, 50, 10}},   // separate last epoch
                                           RefCase{128, 7, "80,20", {100, 5, 0}},           // one epoch, no test
                                           RefCase{32, 99, "1,1,1", {2000, 2000, 900}},     // epochs, no separation
                                           RefCase{16, 0, "98, 2", {0, 3, 0}}));            // num_samples 0

class GptCache : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_dataset(dir_ / "ds", testing::random_docs(300, 100, 1000, 5), DType::U16);
    opts_.data_path = {dir_ / "ds"};
    opts_.seq_length = 32;
    opts_.data_cache_path = dir_ / "cache";
  }
  const GPTDataset& train(const SplitSources& s) { return dynamic_cast<const GPTDataset&>(*s.train); }
  TempDir dir_;
  GPTDataOptions opts_;
  const int64_t sizes_[3] = {500, 10, 0};  // 0.1% of 300 rounds to an empty test split
};

TEST_F(GptCache, SecondBuildLoadsTheCache) {
  SplitSources a = build_gpt_datasets(opts_, sizes_);
  EXPECT_FALSE(train(a).loaded_from_cache());
  const std::string base = dir_ / ("cache/" + train(a).description_hash() + "-GPTDataset-train-");
  for (const char* f : {"description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy"}) {
    EXPECT_TRUE(std::filesystem::exists(base + f)) << f;
  }
  EXPECT_EQ(md5_hex(testing::read_bytes(base + "description.txt")), train(a).description_hash());
  const std::string desc = testing::read_bytes(base + "description.txt");
  EXPECT_NE(desc.find("\"class\": \"GPTDataset\""), std::string::npos) << desc;
  EXPECT_NE(desc.find("\"split_matrix\": [\n        [\n            0,\n            0.969\n"), std::string::npos) << desc;

  SplitSources b = build_gpt_datasets(opts_, sizes_);
  EXPECT_TRUE(train(b).loaded_from_cache());
  std::vector<int32_t> x(33), y(33);
  for (int64_t i = 0; i < train(a).size(); i += 7) {
    a.train->get(i, x.data());
    b.train->get(i, y.data());
    ASSERT_EQ(x, y) << i;
  }
  // Another seed is another dataset: a new cache entry, not a hit.
  opts_.seed = 5;
  SplitSources c = build_gpt_datasets(opts_, sizes_);
  EXPECT_FALSE(train(c).loaded_from_cache());
  EXPECT_NE(train(c).description_hash(), train(a).description_hash());

  if (testing::have_numpy()) {  // numpy reads our cache files
    const std::string cmd = "/usr/bin/python3 -c \"import numpy,sys; a=numpy.load(sys.argv[1]); "
                            "assert a.dtype==numpy.int32 and a.ndim==2 and a.shape[1]==2\" " + base + "sample_index.npy";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
}

TEST_F(GptCache, DamagedCacheIsRebuilt) {
  SplitSources a = build_gpt_datasets(opts_, sizes_);
  const std::string base = dir_ / ("cache/" + train(a).description_hash() + "-GPTDataset-train-");
  const std::string shuffle = testing::read_bytes(base + "shuffle_index.npy");
  testing::write_bytes(base + "shuffle_index.npy", shuffle.substr(0, shuffle.size() - 4));
  SplitSources b = build_gpt_datasets(opts_, sizes_);
  EXPECT_FALSE(train(b).loaded_from_cache());
  EXPECT_EQ(testing::read_bytes(base + "shuffle_index.npy"), shuffle);
  // Out-of-range entries are caught too, not just wrong sizes.
  std::string bad = testing::read_bytes(base + "document_index.npy");
  const int32_t huge = 1 << 30;
  std::memcpy(bad.data() + bad.size() - 4, &huge, 4);
  testing::write_bytes(base + "document_index.npy", bad);
  EXPECT_FALSE(train(build_gpt_datasets(opts_, sizes_)).loaded_from_cache());
  EXPECT_TRUE(train(build_gpt_datasets(opts_, sizes_)).loaded_from_cache());
}

TEST_F(GptCache, DefaultCacheLivesNextToTheData) {
  opts_.data_cache_path.clear();
  SplitSources a = build_gpt_datasets(opts_, sizes_);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "ds/cache/GPTDataset_indices"));
  EXPECT_TRUE(train(build_gpt_datasets(opts_, sizes_)).loaded_from_cache());
}

TEST(GptDatasetErrors, BadOptionsAreNamed) {
  TempDir dir;
  testing::write_dataset(dir / "ds", testing::random_docs(3, 50, 100, 1), DType::U16);
  GPTDataOptions o;
  o.data_path = {dir / "ds"};
  o.seq_length = 8;
  o.data_cache_path = dir / "cache";
  const int64_t sizes[3] = {10, 10, 0};
  auto message = [&](const GPTDataOptions& opts) -> std::string {
    try {
      build_gpt_datasets(opts, sizes);
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  o.split = "98,1,1";  // 3 documents: the valid split rounds to nothing, a warning and no validation set
  EXPECT_EQ(build_gpt_datasets(o, sizes).valid, nullptr);
  o.split = "1,98,1";  // the train split rounds to nothing: fatal
  EXPECT_NE(message(o).find("train split empty"), std::string::npos) << message(o);
  o.split = "1,1,1";
  o.seq_length = 1;
  EXPECT_NE(message(o).find("--seq-length"), std::string::npos);
  o.seq_length = 8;
  o.seed = 1ULL << 33;
  EXPECT_NE(message(o).find("--seed"), std::string::npos);
  o.seed = 1;
  o.data_path = {dir / "nope"};
  EXPECT_NE(message(o).find("nope"), std::string::npos);
  o.data_path.clear();
  EXPECT_NE(message(o).find("--data-path"), std::string::npos);
  o.data_path = {dir / "ds"};
  o.train_data_path = {dir / "ds"};
  EXPECT_NE(message(o).find("cannot be combined"), std::string::npos);
}

}  // namespace
}  // namespace mt::data
