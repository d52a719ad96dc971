// --mock-data: Megatron's MockGPTLowLevelDataset document lengths and contents, and the GPT
// indices over it against the numpy reference.
#include <gtest/gtest.h>

#include "data/gpt_dataset.h"
#include "data/mock_dataset.h"
#include "data/reference/data_test_util.h"

namespace mt::data {
namespace {

using testing::TempDir;

TEST(MockData, DocumentsFollowMegatron) {
  MockLowLevelDataset m(/*eod=*/50256, /*vocab_size=*/0);
  EXPECT_EQ(m.num_sequences(), 100000);
  // numpy.random.default_rng(0).integers(1, 4096, 100000, dtype=int32)[:5]
  const int32_t first[] = {3484, 2609, 2094, 1105, 1261};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(m.sequence_length(i), first[i]);
  std::vector<int32_t> t(5);
  m.read(3, 1100, 5, t.data());
  EXPECT_EQ(t, (std::vector<int32_t>{1101, 1102, 1103, 1104, 50256}));  // 1..L-1, then EOD
}

TEST(MockData, SmallVocabularyStaysInRange) {
  MockLowLevelDataset m(-1, 100);
  std::vector<int32_t> t(static_cast<size_t>(m.sequence_length(0)));
  m.read(0, 0, static_cast<int64_t>(t.size()), t.data());
  for (int32_t id : t) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 100);
  }
  EXPECT_EQ(t.back(), 99);
}

TEST(MockData, IndicesMatchNumpyReference) {
  if (!testing::have_numpy()) GTEST_SKIP() << "numpy not available: no reference to compare with";
  GPTDataOptions o;
  o.mock = true;
  o.seq_length = 1024;
  o.seed = 1234;
  o.eod = 7;
  const int64_t sizes[3] = {200000, 64, 8};
  SplitSources s = build_gpt_datasets(o, sizes);
  TempDir dir;
  testing::run_reference("gpt_reference.py", "--mock --out " + dir.path() + " --seq-length 1024 --seed 1234 --sizes 200000,64,8");
  const NpyArray lengths = NpyArray::load(dir / "mock_lengths.npy");
  MockLowLevelDataset m(7, 0);
  ASSERT_EQ(lengths.numel(), 100000);
  for (int64_t i = 0; i < 100000; ++i) ASSERT_EQ(lengths.at(i), m.sequence_length(i)) << i;
  const char* names[3] = {"train", "valid", "test"};
  const SampleSource* splits[3] = {s.train.get(), s.valid.get(), s.test.get()};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    const auto& g = dynamic_cast<const GPTDataset&>(*splits[i]);
    for (const char* which : {"document_index", "sample_index", "shuffle_index"}) {
      const NpyArray& ours = std::string(which) == "document_index" ? g.document_index()
                             : std::string(which) == "sample_index" ? g.sample_index() : g.shuffle_index();
      const NpyArray theirs = NpyArray::load(dir / (std::string(names[i]) + "-" + which + ".npy"));
      ASSERT_EQ(ours.shape(), theirs.shape()) << which;
      EXPECT_EQ(ours.descr(), theirs.descr()) << which;
      int64_t mismatches = 0;
      for (int64_t k = 0; k < ours.numel(); ++k) mismatches += ours.at(k) != theirs.at(k);
      EXPECT_EQ(mismatches, 0) << which;
    }
  }
  EXPECT_EQ(s.train->seq_length(), 1024);
}

}  // namespace
}  // namespace mt::data
