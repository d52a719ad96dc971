#pragma once
// What the trainer reads: a random-access set of training samples, each seq_length + 1 tokens
// (inputs are tokens[0:S], labels tokens[1:S+1]), as Megatron's GPTDataset yields them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mt::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // Writes seq_length + 1 token ids of sample `index` (0 <= index < size()).
  virtual void get(int64_t index, int32_t* tokens) const = 0;
  virtual int64_t seq_length() const = 0;
};

struct GPTDataOptions {
  std::vector<std::string> data_path;   // --data-path: "PREFIX" or "W1 PREFIX1 W2 PREFIX2 ..."
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;  // per-split paths
  std::string split = "969, 30, 1";      // --split
  std::string data_cache_path;          // --data-cache-path ("" = next to the data)
  int64_t seq_length = 0;               // --seq-length
  uint64_t seed = 1234;                 // --seed
  bool mock = false;                    // --mock-data
  int64_t mock_vocab_size = 0;          // vocab for mock data
  int32_t eod = -1;                     // EOD id of the tokenizer
};

struct SplitSources {
  std::unique_ptr<SampleSource> train, valid, test;  // null when a split is empty
};

// Builds Megatron's train/valid/test GPT datasets (with blending when several prefixes are
// given) holding at least `num_samples[i]` samples each. Throws mt::Error on bad input.
SplitSources build_gpt_datasets(const GPTDataOptions& opts, const int64_t num_samples[3]);

}  // namespace mt::data
