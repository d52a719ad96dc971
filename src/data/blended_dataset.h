#pragma once
// Megatron's BlendedDataset: draws sample i from the dataset d that maximises
// weight_d * max(i, 1) - count_d (helpers.cpp build_blending_indices), so every prefix of the
// blend follows the weights as closely as integers allow. Indices are cached like GPTDataset's
// when a cache directory is given.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"

namespace mt::data {

struct BlendingIndices {
  std::vector<int16_t> dataset_index;         // which dataset sample i comes from
  std::vector<int64_t> dataset_sample_index;  // which sample of that dataset
};
BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size);

class BlendedDataset final : public SampleSource {
 public:
  // `weights` are normalised again here, as Megatron does. `path_to_cache` "" = no cache.
  BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets, const std::vector<double>& weights,
                 int64_t size, const std::string& path_to_cache);

  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return datasets_.front()->seq_length(); }
  void get(int64_t index, int32_t* tokens) const override;

  const std::vector<std::shared_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const NpyArray& dataset_index() const { return dataset_index_; }
  const NpyArray& dataset_sample_index() const { return dataset_sample_index_; }
  const std::string& description_hash() const { return hash_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  bool try_load(const std::string& base);

  std::vector<std::shared_ptr<GPTDataset>> datasets_;
  std::vector<double> weights_;
  int64_t size_;
  std::string description_, hash_;
  bool loaded_from_cache_ = false;
  NpyArray dataset_index_, dataset_sample_index_;
};

}  // namespace mt::data
