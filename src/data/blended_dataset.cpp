#include "data/blended_dataset.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_dataset_md5.h"

namespace mt::data {

namespace fs = std::filesystem;

BlendingIndices build_blending_indices(const std::vector<double>& weights, int64_t size) {
  const size_t n = weights.size();
  BlendingIndices out;
  out.dataset_index.resize(static_cast<size_t>(size));
  out.dataset_sample_index.resize(static_cast<size_t>(size));
  std::vector<int64_t> current(n, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double x = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_error = weights[0] * x - static_cast<double>(current[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * x - static_cast<double>(current[d]);
      if (error > best_error) {  // strict: ties go to the lower index, as in helpers.cpp
        best_error = error;
        best = d;
      }
    }
    out.dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    out.dataset_sample_index[static_cast<size_t>(i)] = current[best]++;
  }
  return out;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets,
                               const std::vector<double>& weights, int64_t size,
                               const std::string& path_to_cache)
    : datasets_(std::move(datasets)), weights_(normalize_weights(weights)), size_(size) {
  MT_CHECK(!datasets_.empty() && datasets_.size() == weights.size(), "{} datasets, {} weights",
           datasets_.size(), weights.size());
  if (datasets_.size() >= 32767) fail("a blend holds at most 32766 datasets (got {})", datasets_.size());

  nlohmann::ordered_json ids;
  ids["class"] = "BlendedDataset";
  ids["datasets"] = nlohmann::ordered_json::array();
  for (const auto& d : datasets_) ids["datasets"].push_back(d->unique_identifiers());
  ids["weights"] = weights_;
  ids["size"] = size_;
  description_ = ids.dump(4);
  hash_ = md5_hex(description_);

  const std::string base =
      path_to_cache.empty() ? "" : (fs::path(path_to_cache) / (hash_ + "-BlendedDataset-")).string();
  if (!base.empty() && try_load(base)) {
    loaded_from_cache_ = true;
    return;
  }
  BlendingIndices b = build_blending_indices(weights_, size_);
  dataset_index_ = NpyArray("<i2", {size_});
  dataset_sample_index_ = NpyArray("<i8", {size_});
  if (size_ > 0) {
    std::memcpy(dataset_index_.mutable_bytes(), b.dataset_index.data(), b.dataset_index.size() * 2);
    std::memcpy(dataset_sample_index_.mutable_bytes(), b.dataset_sample_index.data(), b.dataset_sample_index.size() * 8);
  }
  // Every sample the blend asks for must exist; the surplus Megatron builds normally ensures it.
  std::vector<int64_t> count(datasets_.size(), 0);
  for (int16_t d : b.dataset_index) ++count[static_cast<size_t>(d)];
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (count[d] > datasets_[d]->size()) {
      fail("the blend draws {} samples from {} but it holds only {}; raise its share of the data "
           "or lower the number of samples", count[d],
           datasets_[d]->unique_identifiers().value("dataset_path", std::string("dataset")), datasets_[d]->size());
    }
  }
  if (!base.empty()) {
    std::error_code ec;
    fs::create_directories(path_to_cache, ec);
    if (ec) fail("cannot create --data-cache-path {}: {}", path_to_cache, ec.message());
    dataset_index_.save(base + "dataset_index.npy");
    dataset_sample_index_.save(base + "dataset_sample_index.npy");
    write_file_atomically(base + "description.txt", description_);
  }
  log_info("> built BlendedDataset of {} datasets: {} samples", datasets_.size(), size_);
}

bool BlendedDataset::try_load(const std::string& base) {
  const std::string desc = base + "description.txt", di = base + "dataset_index.npy",
                    si = base + "dataset_sample_index.npy";
  for (const auto& p : {desc, di, si}) {
    if (!fs::is_regular_file(p)) return false;
  }
  try {
    std::ifstream in(desc, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() != description_) fail("{} does not match this blend's description", desc);
    NpyArray d = NpyArray::load(di), s = NpyArray::load(si);
    if (d.descr() != "<i2" || d.shape() != std::vector<int64_t>{size_}) fail("{} should hold {} int16", di, size_);
    if (s.descr() != "<i8" || s.shape() != std::vector<int64_t>{size_}) fail("{} should hold {} int64", si, size_);
    for (int64_t i = 0; i < size_; ++i) {
      const int64_t ds = d.at(i), k = s.at(i);
      if (ds < 0 || ds >= static_cast<int64_t>(datasets_.size()) || k < 0 ||
          k >= datasets_[static_cast<size_t>(ds)]->size()) {
        fail("{} / {} entry {} = ({}, {}) is out of range", di, si, i, ds, k);
      }
    }
    dataset_index_ = std::move(d);
    dataset_sample_index_ = std::move(s);
    return true;
  } catch (const Error& e) {
    log_warn("ignoring the cached BlendedDataset indices {}*: {}; rebuilding them", base, e.what());
    return false;
  }
}

void BlendedDataset::get(int64_t index, int32_t* tokens) const {
  MT_CHECK(index >= 0 && index < size_, "sample {} of {}", index, size_);
  datasets_[static_cast<size_t>(dataset_index_.at(index))]->get(dataset_sample_index_.at(index), tokens);
}

}  // namespace mt::data
