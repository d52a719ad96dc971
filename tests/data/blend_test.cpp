// Blending: Megatron's blending index, --data-path parsing, weighted and unweighted blends,
// per-split paths, and the blend cache, checked against a numpy reference where available.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "data/blended_config.h"
#include "data/blended_dataset.h"
#include "data/reference/data_test_util.h"

namespace mt::data {
namespace {

using testing::TempDir;

TEST(Blending, CountsFollowTheWeights) {
  const std::vector<double> w = {0.3, 0.7};
  const BlendingIndices b = build_blending_indices(w, 1000);
  std::vector<int64_t> count(2, 0);
  for (size_t i = 0; i < b.dataset_index.size(); ++i) {
    const int d = b.dataset_index[i];
    EXPECT_EQ(b.dataset_sample_index[i], count[static_cast<size_t>(d)]);
    ++count[static_cast<size_t>(d)];
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_LE(std::abs(static_cast<double>(count[k]) - w[k] * static_cast<double>(i + 1)), 1.0) << i;
    }
  }
  EXPECT_EQ(count, (std::vector<int64_t>{300, 700}));
  // Equal weights alternate, and ties go to the first dataset.
  const BlendingIndices e = build_blending_indices({0.5, 0.5}, 6);
  EXPECT_EQ(e.dataset_index, (std::vector<int16_t>{0, 1, 0, 1, 0, 1}));
  const BlendingIndices t = build_blending_indices({0.5, 0.25, 0.25}, 400);
  std::vector<int64_t> c3(3, 0);
  for (int16_t d : t.dataset_index) ++c3[static_cast<size_t>(d)];
  EXPECT_EQ(c3, (std::vector<int64_t>{200, 100, 100}));
}

TEST(Blending, ParsesDataPath) {
  Blend b = parse_blend({"A"}, "--data-path");
  EXPECT_EQ(b.prefixes, std::vector<std::string>{"A"});
  EXPECT_TRUE(b.weights.empty());
  b = parse_blend({"0.3", "A", "0.7", "B"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_EQ(b.weights, (std::vector<double>{0.3, 0.7}));
  b = parse_blend({"30 A 70 B"}, "--data-path");  // one string holding the whole blend
  EXPECT_EQ(b.weights, (std::vector<double>{30, 70}));
  b = parse_blend({"A", "B"}, "--data-path");
  EXPECT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_TRUE(b.weights.empty());
  EXPECT_THROW(parse_blend({"0.3", "A", "B", "C"}, "--data-path"), Error);
  EXPECT_THROW(parse_blend({"0", "A", "0", "B"}, "--data-path"), Error);
  EXPECT_THROW(parse_blend({"-1", "A", "2", "B"}, "--data-path"), Error);
  EXPECT_EQ(blend_dataset_size(0.3, 1000, 0.005), 302);  // ceil(ceil(300.0) * 1.005) = ceil(301.5)
  EXPECT_EQ(blend_dataset_size(0.3, 1000, 0.0), 300);
}

class BlendData : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_dataset(dir_ / "a", testing::random_docs(300, 80, 1000, 21), DType::U16);
    testing::write_dataset(dir_ / "b", testing::random_docs(200, 120, 1000, 22), DType::U16);
    opts_.seq_length = 32;
    opts_.split = "90,8,2";
    opts_.data_cache_path = dir_ / "cache";
  }
  static const BlendedDataset& blended(const std::unique_ptr<SampleSource>& s) {
    return dynamic_cast<const BlendedDataset&>(*s);
  }
  TempDir dir_;
  GPTDataOptions opts_;
};

void expect_same_array(const NpyArray& ours, const std::string& theirs_path) {
  const NpyArray theirs = NpyArray::load(theirs_path);
  EXPECT_EQ(ours.descr(), theirs.descr()) << theirs_path;
  ASSERT_EQ(ours.shape(), theirs.shape()) << theirs_path;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) mismatches += ours.at(i) != theirs.at(i);
  EXPECT_EQ(mismatches, 0) << theirs_path;
}

TEST_F(BlendData, WeightedBlendMatchesNumpyReference) {
  opts_.data_path = {"0.3", dir_ / "a", "0.7", dir_ / "b"};
  const int64_t sizes[3] = {700, 40, 9};
  SplitSources s = build_gpt_datasets(opts_, sizes);
  const char* names[3] = {"train", "valid", "test"};
  const std::unique_ptr<SampleSource>* splits[3] = {&s.train, &s.valid, &s.test};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    const BlendedDataset& bd = blended(*splits[i]);
    // Megatron's size: the sum over datasets of ceil(size * weight).
    EXPECT_EQ(bd.size(), static_cast<int64_t>(std::ceil(sizes[i] * 0.3) + std::ceil(sizes[i] * 0.7)));
    std::vector<int32_t> x(33), y(33);
    for (int64_t k = 0; k < bd.size(); k += 13) {
      bd.get(k, x.data());
      bd.datasets()[static_cast<size_t>(bd.dataset_index().at(k))]->get(bd.dataset_sample_index().at(k), y.data());
      ASSERT_EQ(x, y);
    }
  }
  if (!testing::have_numpy()) GTEST_SKIP() << "numpy not available: no reference to compare with";
  std::filesystem::create_directory(dir_ / "ref");
  testing::run_reference("gpt_reference.py",
                         fmt::format("--out {} --blend '0.3 {} 0.7 {}' --seq-length 32 --seed 1234 --split 90,8,2 "
                                     "--sizes 700,40,9",
                                     dir_ / "ref", dir_ / "a", dir_ / "b"));
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    const BlendedDataset& bd = blended(*splits[i]);
    const std::string ref = dir_ / (std::string("ref/") + names[i]);
    expect_same_array(bd.dataset_index(), ref + "-dataset_index.npy");
    expect_same_array(bd.dataset_sample_index(), ref + "-dataset_sample_index.npy");
    for (size_t d = 0; d < 2; ++d) {
      const GPTDataset& g = *bd.datasets()[d];
      expect_same_array(g.document_index(), ref + "-" + std::to_string(d) + "-document_index.npy");
      expect_same_array(g.sample_index(), ref + "-" + std::to_string(d) + "-sample_index.npy");
      expect_same_array(g.shuffle_index(), ref + "-" + std::to_string(d) + "-shuffle_index.npy");
    }
  }
}

TEST_F(BlendData, UnweightedBlendUsesDatasetSizes) {
  opts_.data_path = {dir_ / "a", dir_ / "b"};
  const int64_t sizes[3] = {100000, 10, 0};
  SplitSources s = build_gpt_datasets(opts_, sizes);
  const BlendedDataset& train = blended(s.train);
  const int64_t na = train.datasets()[0]->size(), nb = train.datasets()[1]->size();
  EXPECT_EQ(train.datasets()[0]->num_epochs(), 1);  // one epoch each (num_samples None)
  EXPECT_EQ(train.size(), na + nb);                  // capped at what the datasets hold
  std::vector<int64_t> count(2, 0);
  for (int64_t i = 0; i < train.size(); ++i) ++count[static_cast<size_t>(train.dataset_index().at(i))];
  EXPECT_EQ(count, (std::vector<int64_t>{na, nb}));
  EXPECT_EQ(blended(s.valid).size(), 10);
}

TEST_F(BlendData, PerSplitPaths) {
  opts_.train_data_path = {dir_ / "a"};
  opts_.valid_data_path = {"1", dir_ / "a", "3", dir_ / "b"};
  const int64_t sizes[3] = {200, 40, 7};
  SplitSources s = build_gpt_datasets(opts_, sizes);
  const auto* train = dynamic_cast<const GPTDataset*>(s.train.get());
  ASSERT_NE(train, nullptr);
  EXPECT_GE(train->size(), 200);
  EXPECT_EQ(train->document_index().numel() % 300, 0);  // all 300 documents of a, whole epochs
  EXPECT_TRUE(train->unique_identifiers()["split"].is_null());
  EXPECT_EQ(blended(s.valid).size(), 10 + 30);
  EXPECT_EQ(s.test, nullptr);
}

TEST_F(BlendData, BlendIndicesAreCached) {
  opts_.data_path = {"1", dir_ / "a", "1", dir_ / "b"};
  const int64_t sizes[3] = {300, 20, 0};
  SplitSources first = build_gpt_datasets(opts_, sizes);
  EXPECT_FALSE(blended(first.train).loaded_from_cache());
  SplitSources again = build_gpt_datasets(opts_, sizes);
  EXPECT_TRUE(blended(again.train).loaded_from_cache());
  EXPECT_TRUE(blended(again.train).datasets()[1]->loaded_from_cache());
  for (int64_t i = 0; i < 300; ++i) {
    ASSERT_EQ(blended(first.train).dataset_index().at(i), blended(again.train).dataset_index().at(i));
  }
}

}  // namespace
}  // namespace mt::data
