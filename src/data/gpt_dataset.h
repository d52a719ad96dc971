#pragma once
// Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py): a sequence range of a
// low-level dataset, flattened into samples of sequence_length + 1 tokens that overlap by one,
// in an order fixed by numpy's RandomState(seed). The three indices (document, sample, shuffle)
// are built exactly as Megatron builds them and cached as .npy files keyed by an MD5 of the
// dataset's description, so a second run (or another rank) loads them instead of rebuilding.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/blended_config.h"
#include "data/indexed_dataset.h"
#include "data/numpy_npy.h"
#include "data/numpy_random.h"
#include "data/sample_source.h"

namespace mt::data {

// What a GPTDataset samples from: sequences of tokens (Megatron's "low-level dataset").
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  virtual int64_t num_sequences() const = 0;
  virtual int32_t sequence_length(int64_t i) const = 0;
  virtual int32_t max_sequence_length() const = 0;
  virtual void read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const = 0;
};

class IndexedLowLevelDataset final : public LowLevelDataset {
 public:
  explicit IndexedLowLevelDataset(const std::string& prefix) : ds_(prefix) {}
  int64_t num_sequences() const override { return ds_.num_sequences(); }
  int32_t sequence_length(int64_t i) const override { return ds_.sequence_length(i); }
  int32_t max_sequence_length() const override { return ds_.max_sequence_length(); }
  void read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override {
    ds_.read(seq, offset, length, out);
  }
  const IndexedDataset& dataset() const { return ds_; }

 private:
  IndexedDataset ds_;
};

struct GPTDatasetConfig {
  uint64_t random_seed = 1234;
  int64_t sequence_length = 0;
  std::string split;          // as given on the command line; "" when splits come per path
  SplitMatrix split_matrix;   // all nullopt when splits come per path
  std::string path_to_cache;  // --data-cache-path; "" = PREFIX/cache/GPTDataset_indices
  bool mock = false;          // mock data is never cached (as in Megatron)
};

// The index arithmetic, exposed for tests against a numpy reference.
namespace gpt_index {
// Megatron's _get_num_epochs (num_samples < 0 means None: one epoch).
int64_t num_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t seq_length);
// _build_document_index over the sequence range [begin, end).
std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch);
// helpers.cpp build_sample_idx (drop_last_partial_sequence, add_extra_token_to_sequence = 1);
// int32 entries when they fit (helpers.py's rule), else int64. Shape [num_samples + 1, 2].
NpyArray build_sample_index(const std::vector<int32_t>& sizes, const std::vector<int32_t>& doc_index,
                            int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch);
// _build_shuffle_index: [0, num_samples) shuffled, then [num_samples, total) shuffled.
NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng);
}  // namespace gpt_index

class GPTDataset final : public SampleSource {
 public:
  // `dataset_path` is the prefix (for the description and the default cache place; "" for mock).
  // Exposes sequences [begin, end). num_samples < 0 means one epoch (Megatron's None).
  GPTDataset(std::shared_ptr<const LowLevelDataset> dataset, std::string dataset_path, int64_t begin,
             int64_t end, int64_t num_samples, Split split, const GPTDatasetConfig& config);

  int64_t size() const override { return sample_index_.shape()[0] - 1; }
  int64_t seq_length() const override { return config_.sequence_length; }
  void get(int64_t index, int32_t* tokens) const override;

  // Megatron's unique_identifiers (the description is its json.dumps(indent=4)).
  const nlohmann::ordered_json& unique_identifiers() const { return identifiers_; }
  const std::string& description_hash() const { return hash_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  int64_t num_epochs() const { return num_epochs_; }

  const NpyArray& document_index() const { return document_index_; }
  const NpyArray& sample_index() const { return sample_index_; }
  const NpyArray& shuffle_index() const { return shuffle_index_; }

 private:
  void build();
  bool try_load(const std::string& base);
  void save(const std::string& base) const;

  std::shared_ptr<const LowLevelDataset> dataset_;
  std::string dataset_path_;
  int64_t begin_, end_, num_samples_;
  Split split_;
  GPTDatasetConfig config_;
  nlohmann::ordered_json identifiers_;
  std::string description_, hash_;
  int64_t tokens_per_epoch_ = 0, num_epochs_ = 0, expected_samples_ = 0;
  bool separate_final_epoch_ = false;
  int64_t num_samples_sans_final_epoch_ = 0;
  bool loaded_from_cache_ = false;
  NpyArray document_index_, sample_index_, shuffle_index_;
};

}  // namespace mt::data
