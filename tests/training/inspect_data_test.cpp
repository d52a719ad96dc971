// `megatron inspect-data` against the datasets pretrain builds and, where numpy is installed,
// against the numpy reference of Megatron's GPT dataset (tests/data/reference/gpt_reference.py):
// every sample printed is the one Megatron's index arithmetic picks.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/numpy_npy.h"
#include "data/reference/data_test_util.h"
#include "training/commands.h"

namespace mt::data {
namespace {

std::vector<nlohmann::json> run(const std::vector<std::string>& args) {
  ::testing::internal::CaptureStdout();
  const int rc = inspect_data_main(args);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(nlohmann::json::parse(l));
  return lines;
}

class InspectData : public ::testing::Test {
 protected:
  void SetUp() override {
    docs_ = testing::random_docs(200, 100, 5000, 3);
    testing::write_dataset(dir_ / "ds", docs_, DType::U16);
  }
  std::vector<std::string> sample_args(const std::string& cache) const {
    return {"--data-path", dir_ / "ds", "--seq-length", "32", "--seed", "5", "--split", "90,8,2",
            "--samples", "300,20,5", "--data-cache-path", cache};
  }
  testing::TempDir dir_;
  testing::Docs docs_;
};

TEST_F(InspectData, SamplesAreThePretrainDatasetsInIndexOrder) {
  const auto lines = run(sample_args(dir_ / "cache"));
  GPTDataOptions o;
  o.data_path = {dir_ / "ds"};
  o.seq_length = 32;
  o.seed = 5;
  o.split = "90,8,2";
  o.data_cache_path = dir_ / "cache";
  const int64_t sizes[3] = {300, 20, 5};
  const SplitSources s = build_gpt_datasets(o, sizes);
  const std::pair<const char*, const SampleSource*> splits[3] = {
      {"train", s.train.get()}, {"valid", s.valid.get()}, {"test", s.test.get()}};
  size_t at = 0;
  std::vector<int32_t> tokens(33);
  for (int k = 0; k < 3; ++k) {
    const auto& [name, src] = splits[k];
    ASSERT_NE(src, nullptr) << name;
    EXPECT_GE(src->size(), sizes[k]);
    for (int64_t i = 0; i < src->size(); ++i, ++at) {
      ASSERT_LT(at, lines.size());
      const auto& l = lines[at];
      ASSERT_EQ(l["split"], name);
      ASSERT_EQ(l["index"], i);
      src->get(i, tokens.data());
      ASSERT_EQ(l["tokens"].get<std::vector<int32_t>>(), tokens) << name << " sample " << i;
    }
  }
  EXPECT_EQ(at, lines.size());

  const auto valid = run({"--data-path", dir_ / "ds", "--seq-length", "32", "--seed", "5", "--split", "90,8,2",
                          "--samples", "300,20,5", "--data-cache-path", dir_ / "cache", "--split-name", "valid",
                          "--limit", "4"});
  ASSERT_EQ(valid.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(valid[i]["split"], "valid");
}

TEST_F(InspectData, SamplesMatchTheNumpyReference) {
  if (!testing::have_numpy()) GTEST_SKIP() << "numpy not available: no reference to compare with";
  const auto lines = run(sample_args(dir_ / "cache"));
  std::filesystem::create_directory(dir_ / "ref");
  testing::run_reference("gpt_reference.py", "--out " + dir_ / "ref" + " --prefix " + dir_ / "ds" +
                                                 " --seq-length 32 --seed 5 --split '90,8,2' --sizes 300,20,5");
  const IndexedDataset data(dir_ / "ds");
  size_t at = 0;
  for (const char* name : {"train", "valid", "test"}) {
    const std::string ref = dir_ / (std::string("ref/") + name);
    const NpyArray doc = NpyArray::load(ref + "-document_index.npy");
    const NpyArray smp = NpyArray::load(ref + "-sample_index.npy");
    const NpyArray shuf = NpyArray::load(ref + "-shuffle_index.npy");
    // Megatron's sample j: from (document_index[sample_index[j][0]], offset sample_index[j][1]) to
    // (sample_index[j+1]) inclusive of one more token.
    std::vector<int32_t> stream;
    std::vector<int64_t> starts;
    for (int64_t i = 0; i < doc.numel(); ++i) {
      starts.push_back(static_cast<int64_t>(stream.size()));
      std::vector<int32_t> t(static_cast<size_t>(data.sequence_length(doc.at(i))));
      data.read(doc.at(i), 0, static_cast<int64_t>(t.size()), t.data());
      stream.insert(stream.end(), t.begin(), t.end());
    }
    for (int64_t i = 0; i < shuf.numel(); ++i, ++at) {
      ASSERT_LT(at, lines.size());
      ASSERT_EQ(lines[at]["split"], name);
      const int64_t j = shuf.at(i);
      const int64_t begin = starts[static_cast<size_t>(smp.at(2 * j))] + smp.at(2 * j + 1);
      const std::vector<int32_t> want(stream.begin() + begin, stream.begin() + begin + 33);
      ASSERT_EQ(lines[at]["tokens"].get<std::vector<int32_t>>(), want) << name << " sample " << i;
    }
  }
  EXPECT_EQ(at, lines.size());
}

TEST_F(InspectData, InfoAndDocument) {
  const auto info = run({"--info", dir_ / "ds"});
  ASSERT_EQ(info.size(), 1u);
  int64_t tokens = 0, longest = 0;
  for (const auto& d : docs_) {
    tokens += static_cast<int64_t>(d[0].size());
    longest = std::max<int64_t>(longest, static_cast<int64_t>(d[0].size()));
  }
  EXPECT_EQ(info[0]["documents"], 200);
  EXPECT_EQ(info[0]["tokens"], tokens);
  EXPECT_EQ(info[0]["dtype"], "uint16");
  EXPECT_EQ(info[0]["max_document_tokens"], longest);
  int64_t in_histogram = 0;
  for (const auto& b : info[0]["document_length_histogram"]) in_histogram += b["documents"].get<int64_t>();
  EXPECT_EQ(in_histogram, 200);

  const auto doc = run({"--info", dir_ / "ds", "--document", "7"});
  ASSERT_EQ(doc.size(), 1u);
  std::vector<int32_t> want(docs_[7][0].begin(), docs_[7][0].end());
  EXPECT_EQ(doc[0]["tokens"].get<std::vector<int32_t>>(), want);
  try {
    inspect_data_main({"--info", dir_ / "ds", "--document", "200"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--document 200"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mt::data
