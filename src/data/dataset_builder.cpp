// build_gpt_datasets: Megatron's BlendedMegatronDatasetBuilder for GPT data. One prefix gives
// GPTDatasets split by --split; several prefixes give BlendedDatasets over per-prefix
// GPTDatasets; --train/valid/test-data-path give each split its own blend; --mock-data gives
// GPTDatasets over MockLowLevelDataset. Sizes follow Megatron's arithmetic exactly.
#include <array>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "data/blended_config.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/mock_dataset.h"
#include "data/sample_source.h"

namespace mt::data {

namespace {

using Sizes = std::array<int64_t, 3>;  // -1 = None (one epoch)
using MidLevel = std::array<std::unique_ptr<GPTDataset>, 3>;

class Builder {
 public:
  Builder(const GPTDataOptions& opts, const int64_t num_samples[3]) : opts_(opts) {
    for (int i = 0; i < 3; ++i) {
      MT_CHECK(num_samples[i] >= 0, "num_samples[{}] = {}", i, num_samples[i]);
      sizes_[static_cast<size_t>(i)] = num_samples[i];
    }
    if (opts.seq_length < 2) fail("--seq-length must be at least 2 to build GPT samples (got {})", opts.seq_length);
    if (opts.seed > 0xffffffffULL) {
      fail("--seed {} is too large: the data order uses numpy's RandomState, which takes seeds in "
           "[0, 2^32 - 1]", opts.seed);
    }
    config_.random_seed = opts.seed;
    config_.sequence_length = opts.seq_length;
    config_.path_to_cache = opts.data_cache_path;
  }

  SplitSources build() {
    if (opts_.mock) return build_mock();
    const bool per_split = !opts_.train_data_path.empty() || !opts_.valid_data_path.empty() ||
                           !opts_.test_data_path.empty();
    if (per_split && !opts_.data_path.empty()) {
      fail("--data-path cannot be combined with --train-data-path/--valid-data-path/--test-data-path; "
           "give either one blend split by --split, or a blend per split");
    }
    if (!per_split && opts_.data_path.empty()) {
      fail("no training data: pass --data-path PREFIX (files PREFIX.bin/.idx from 'megatron "
           "preprocess'), --train-data-path, or --mock-data");
    }
    return per_split ? build_per_split() : build_one_distribution();
  }

 private:
  SplitSources build_mock() {
    GPTDatasetConfig cfg = config_;
    cfg.mock = true;
    cfg.split = "1,1,1";  // Megatron's mock data always splits evenly
    cfg.split_matrix = split_matrix_from_vector(parse_and_normalize_split(cfg.split));
    auto low = std::make_shared<MockLowLevelDataset>(opts_.eod, opts_.mock_vocab_size);
    MidLevel mid = build_splits(low, "", cfg.split_matrix, sizes_, cfg);
    return to_sources(std::move(mid));
  }

  SplitSources build_one_distribution() {
    const Blend blend = parse_blend(opts_.data_path, "--data-path");
    config_.split = opts_.split;
    config_.split_matrix = split_matrix_from_vector(parse_and_normalize_split(opts_.split));
    if (blend.prefixes.size() == 1 && blend.weights.empty()) {
      return to_sources(build_prefix(blend.prefixes[0], config_.split_matrix, sizes_, config_));
    }
    return blend_splits(blend, config_.split_matrix, sizes_, config_, {true, true, true});
  }

  SplitSources build_per_split() {
    SplitSources out;
    const std::vector<std::string>* paths[3] = {&opts_.train_data_path, &opts_.valid_data_path,
                                                &opts_.test_data_path};
    const char* flags[3] = {"--train-data-path", "--valid-data-path", "--test-data-path"};
    GPTDatasetConfig cfg = config_;
    cfg.split.clear();  // Megatron's config has split = None here
    for (size_t i = 0; i < 3; ++i) {
      if (paths[i]->empty()) continue;
      const Blend blend = parse_blend(*paths[i], flags[i]);
      SplitMatrix spoof;
      spoof[i] = std::make_pair(0.0, 1.0);
      Sizes sizes = {0, 0, 0};
      sizes[i] = sizes_[i];
      std::array<bool, 3> want = {false, false, false};
      want[i] = true;
      SplitSources one;
      if (blend.prefixes.size() == 1) {
        one = to_sources(build_prefix(blend.prefixes[0], spoof, sizes, cfg));
      } else {
        one = blend_splits(blend, spoof, sizes, cfg, want);
      }
      std::unique_ptr<SampleSource>* src[3] = {&one.train, &one.valid, &one.test};
      std::unique_ptr<SampleSource>* dst[3] = {&out.train, &out.valid, &out.test};
      *dst[i] = std::move(*src[i]);
    }
    return out;
  }

  // A blend of several prefixes (or one weighted prefix) over the splits in `want`.
  SplitSources blend_splits(const Blend& blend, const SplitMatrix& matrix, const Sizes& sizes,
                            const GPTDatasetConfig& cfg, std::array<bool, 3> want) {
    const size_t n = blend.prefixes.size();
    const bool weighted = !blend.weights.empty();
    const std::vector<double> w = weighted ? normalize_weights(blend.weights) : std::vector<double>();
    std::vector<MidLevel> mids;
    for (size_t d = 0; d < n; ++d) {
      Sizes buffer = {-1, -1, -1};
      if (weighted) {
        for (size_t i = 0; i < 3; ++i) buffer[i] = blend_dataset_size(w[d], sizes[i], kMidLevelDatasetSurplus);
      }
      mids.push_back(build_prefix(blend.prefixes[d], matrix, buffer, cfg));
    }
    SplitSources out;
    std::unique_ptr<SampleSource>* dst[3] = {&out.train, &out.valid, &out.test};
    for (size_t i = 0; i < 3; ++i) {
      if (!matrix[i] || !want[i]) continue;
      // A split left empty because nothing was asked of it stays absent.
      bool complete = true;
      for (size_t d = 0; d < n; ++d) complete = complete && mids[d][i] != nullptr;
      if (!complete) continue;
      std::vector<std::shared_ptr<GPTDataset>> parts;
      std::vector<double> weights;
      int64_t size = 0;
      for (size_t d = 0; d < n; ++d) {
        parts.push_back(std::shared_ptr<GPTDataset>(std::move(mids[d][i])));
        if (weighted) {
          size += blend_dataset_size(w[d], sizes[i], 0.0);
          weights.push_back(w[d]);
        } else {
          weights.push_back(static_cast<double>(parts.back()->size()));
          size += parts.back()->size();
        }
      }
      if (!weighted) size = std::min(size, sizes[i]);
      *dst[i] = std::make_unique<BlendedDataset>(std::move(parts), weights, size, cfg.path_to_cache);
    }
    return out;
  }

  MidLevel build_prefix(const std::string& prefix, const SplitMatrix& matrix, const Sizes& sizes,
                        const GPTDatasetConfig& cfg) {
    auto it = opened_.find(prefix);
    if (it == opened_.end()) it = opened_.emplace(prefix, std::make_shared<IndexedLowLevelDataset>(prefix)).first;
    return build_splits(it->second, prefix, matrix, sizes, cfg);
  }

  MidLevel build_splits(const std::shared_ptr<const LowLevelDataset>& low, const std::string& prefix,
                        const SplitMatrix& matrix, const Sizes& sizes, const GPTDatasetConfig& cfg) {
    MidLevel out;
    const int64_t count = low->num_sequences();
    for (size_t i = 0; i < 3; ++i) {
      if (!matrix[i]) continue;
      const auto [begin, end] = split_range(*matrix[i], count);
      if (begin == end) {
        if (sizes[i] == 0) continue;  // nothing asked of an empty split
        // Evaluation sets that round to nothing (a small corpus, --split 969,30,1): the run goes
        // on without that evaluation, as the warning says; only an empty train split is fatal.
        if (i != 0) {
          log_warn("{} holds {} sequences, so --split {} leaves its {} split empty: no evaluation on it",
                   prefix.empty() ? "mock data" : prefix, count, cfg.split.empty() ? "(per-path)" : "'" + cfg.split + "'",
                   split_name(static_cast<Split>(i)));
          continue;
        }
        fail("{} holds {} sequences, so --split {} leaves its {} split empty; use more data or a "
             "larger share for that split", prefix.empty() ? "mock data" : prefix, count,
             cfg.split.empty() ? "(per-path)" : "'" + cfg.split + "'", split_name(static_cast<Split>(i)));
      }
      out[i] = std::make_unique<GPTDataset>(low, prefix, begin, end, sizes[i], static_cast<Split>(i), cfg);
    }
    return out;
  }

  static SplitSources to_sources(MidLevel mid) {
    SplitSources s;
    s.train = std::move(mid[0]);
    s.valid = std::move(mid[1]);
    s.test = std::move(mid[2]);
    return s;
  }

  const GPTDataOptions& opts_;
  Sizes sizes_{};
  GPTDatasetConfig config_;
  std::map<std::string, std::shared_ptr<IndexedLowLevelDataset>> opened_;
};

}  // namespace

SplitSources build_gpt_datasets(const GPTDataOptions& opts, const int64_t num_samples[3]) {
  return Builder(opts, num_samples).build();
}

}  // namespace mt::data
