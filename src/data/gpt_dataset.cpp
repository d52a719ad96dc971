#include "data/gpt_dataset.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "data/gpt_dataset_md5.h"

namespace mt::data {

namespace fs = std::filesystem;

namespace {

nlohmann::ordered_json split_matrix_json(const SplitMatrix& m, bool per_path) {
  if (per_path) return nullptr;
  auto arr = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.size(); ++i) {
    if (!m[i]) {
      arr.push_back(nullptr);
      continue;
    }
    // Python builds the first book-end from the integer 0, so json.dumps writes "0" there.
    nlohmann::ordered_json lo = m[i]->first;
    if (i == 0) lo = 0;
    arr.push_back(nlohmann::ordered_json::array({lo, m[i]->second}));
  }
  return arr;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}


}  // namespace

GPTDataset::GPTDataset(std::shared_ptr<const LowLevelDataset> dataset, std::string dataset_path,
                       int64_t begin, int64_t end, int64_t num_samples, Split split,
                       const GPTDatasetConfig& config)
    : dataset_(std::move(dataset)), dataset_path_(std::move(dataset_path)), begin_(begin), end_(end),
      num_samples_(num_samples), split_(split), config_(config) {
  MT_CHECK(begin_ >= 0 && begin_ <= end_ && end_ <= dataset_->num_sequences(), "range [{}, {})", begin_, end_);
  const std::string where = config_.mock ? std::string("mock data") : dataset_path_;
  if (config_.sequence_length < 2) fail("--seq-length must be at least 2 (got {})", config_.sequence_length);
  for (int64_t i = begin_; i < end_; ++i) tokens_per_epoch_ += dataset_->sequence_length(i);
  if (tokens_per_epoch_ <= 1) {
    fail("the {} split of {} holds {} sequences with {} tokens, too few to sample from; give it "
         "more data or change --split", split_name(split_), where, end_ - begin_, tokens_per_epoch_);
  }
  const int64_t seq = config_.sequence_length;
  num_epochs_ = gpt_index::num_epochs(tokens_per_epoch_, num_samples_, seq);
  if (num_epochs_ > 1) {
    // Megatron shuffles the last epoch separately when it is used for less than 80%, so that
    // its few samples are not spread over the whole run.
    num_samples_sans_final_epoch_ = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / seq;
    const int64_t from_final = num_samples_ - num_samples_sans_final_epoch_;
    const int64_t per_epoch = (tokens_per_epoch_ - 1) / seq;
    MT_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "final epoch {} of {}", from_final, per_epoch);
    separate_final_epoch_ = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  expected_samples_ = (num_epochs_ * tokens_per_epoch_ - 1) / seq;

  std::string cache_dir = config_.path_to_cache;
  if (!config_.mock) {
    identifiers_["class"] = "GPTDataset";
    identifiers_["dataset_path"] = dataset_path_;
    identifiers_["num_samples"] = num_samples_ < 0 ? nlohmann::ordered_json(nullptr)
                                                   : nlohmann::ordered_json(num_samples_);
    identifiers_["index_split"] = split_name(split_);
    identifiers_["random_seed"] = config_.random_seed;
    identifiers_["sequence_length"] = config_.sequence_length;
    identifiers_["split"] = config_.split.empty() ? nlohmann::ordered_json(nullptr)
                                                  : nlohmann::ordered_json(config_.split);
    identifiers_["split_matrix"] = split_matrix_json(config_.split_matrix, config_.split.empty());
    description_ = identifiers_.dump(4);
    hash_ = md5_hex(description_);
    if (cache_dir.empty()) cache_dir = (fs::path(dataset_path_) / "cache" / "GPTDataset_indices").string();
  } else {
    cache_dir.clear();
  }

  const std::string base =
      cache_dir.empty() ? "" : (fs::path(cache_dir) / (hash_ + "-GPTDataset-" + split_name(split_))).string();
  if (!base.empty() && try_load(base)) {
    loaded_from_cache_ = true;
    log_info("> loaded GPTDataset {} indices of {} from {}-*: {} samples, {} epochs", split_name(split_),
             where, base, size(), num_epochs_);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  build();
  if (!base.empty()) {
    std::error_code ec;
    fs::create_directories(cache_dir, ec);
    if (ec) {
      fail("cannot create the index cache directory {}: {}; pass --data-cache-path DIR with a "
           "writable directory", cache_dir, ec.message());
    }
    save(base);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("> built GPTDataset {} indices of {}: {} samples, {} epochs ({:.2f} s){}", split_name(split_),
           where, size(), num_epochs_, secs, base.empty() ? "" : ", cached in " + cache_dir);
}

void GPTDataset::build() {
  NumpyRandomState rng(static_cast<uint32_t>(config_.random_seed));
  const std::vector<int32_t> doc_index =
      gpt_index::build_document_index(begin_, end_, num_epochs_, rng, separate_final_epoch_);
  std::vector<int32_t> sizes(static_cast<size_t>(dataset_->num_sequences()));
  for (int64_t i = 0; i < dataset_->num_sequences(); ++i) sizes[static_cast<size_t>(i)] = dataset_->sequence_length(i);
  sample_index_ = gpt_index::build_sample_index(sizes, doc_index, config_.sequence_length, num_epochs_,
                                                tokens_per_epoch_);
  const int64_t total = sample_index_.shape()[0] - 1;
  shuffle_index_ = gpt_index::build_shuffle_index(separate_final_epoch_ ? num_samples_sans_final_epoch_ : total,
                                                  total, rng);
  document_index_ = NpyArray("<i4", {static_cast<int64_t>(doc_index.size())});
  if (!doc_index.empty()) std::memcpy(document_index_.mutable_bytes(), doc_index.data(), doc_index.size() * 4);
}

void GPTDataset::save(const std::string& base) const {
  // The description goes last: Megatron (and we) treat the cache as present only when all four
  // files exist, so an interrupted save is simply rebuilt.
  document_index_.save(base + "-document_index.npy");
  sample_index_.save(base + "-sample_index.npy");
  shuffle_index_.save(base + "-shuffle_index.npy");
  write_file_atomically(base + "-description.txt", description_);
}

bool GPTDataset::try_load(const std::string& base) {
  const std::string desc = base + "-description.txt", di = base + "-document_index.npy",
                    si = base + "-sample_index.npy", sh = base + "-shuffle_index.npy";
  for (const auto& p : {desc, di, si, sh}) {
    if (!fs::is_regular_file(p)) return false;
  }
  try {
    if (read_text(desc) != description_) fail("{} does not match this dataset's description", desc);
    NpyArray d = NpyArray::load(di), s = NpyArray::load(si), h = NpyArray::load(sh);
    const int64_t ndocs = num_epochs_ * (end_ - begin_);
    if (d.descr() != "<i4" || d.shape() != std::vector<int64_t>{ndocs}) {
      fail("{} should hold {} int32 entries", di, ndocs);
    }
    for (int64_t i = 0; i < ndocs; ++i) {
      const int64_t v = d.at(i);
      if (v < begin_ || v >= end_) fail("{} entry {} = {} is outside [{}, {})", di, i, v, begin_, end_);
    }
    if ((s.descr() != "<i4" && s.descr() != "<i8") ||
        s.shape() != std::vector<int64_t>{expected_samples_ + 1, 2}) {
      fail("{} should have shape ({}, 2)", si, expected_samples_ + 1);
    }
    for (int64_t i = 0; i <= expected_samples_; ++i) {
      const int64_t doc = s.at(2 * i), off = s.at(2 * i + 1);
      if (doc < 0 || doc >= ndocs || off < 0 || off > dataset_->sequence_length(d.at(doc))) {
        fail("{} row {} = ({}, {}) points outside the documents", si, i, doc, off);
      }
    }
    if ((h.descr() != "<u4" && h.descr() != "<i8") || h.shape() != std::vector<int64_t>{expected_samples_}) {
      fail("{} should hold {} entries", sh, expected_samples_);
    }
    for (int64_t i = 0; i < expected_samples_; ++i) {
      const int64_t v = h.at(i);
      if (v < 0 || v >= expected_samples_) fail("{} entry {} = {} is out of range", sh, i, v);
    }
    document_index_ = std::move(d);
    sample_index_ = std::move(s);
    shuffle_index_ = std::move(h);
    return true;
  } catch (const Error& e) {
    log_warn("ignoring the cached GPTDataset indices {}-*: {}; rebuilding them", base, e.what());
    return false;
  }
}

void GPTDataset::get(int64_t index, int32_t* tokens) const {
  MT_CHECK(index >= 0 && index < size(), "sample {} of {}", index, size());
  const int64_t i = shuffle_index_.at(index);
  const int64_t b_doc = sample_index_.at(2 * i), b_off = sample_index_.at(2 * i + 1);
  const int64_t e_doc = sample_index_.at(2 * i + 2), e_off = sample_index_.at(2 * i + 3);
  const int64_t want = config_.sequence_length + 1;
  int64_t n = 0;
  for (int64_t d = b_doc; d <= e_doc; ++d) {
    const int64_t seq = document_index_.at(d);
    const int64_t off = d == b_doc ? b_off : 0;
    const int64_t len = d == e_doc ? e_off + 1 - off : dataset_->sequence_length(seq) - off;
    MT_CHECK(len >= 0 && n + len <= want, "sample {} overruns {} tokens", index, want);
    dataset_->read(seq, off, len, tokens + n);
    n += len;
  }
  // Only a partial last sequence can be short, and Megatron drops those; pad as it would (id 0).
  for (; n < want; ++n) tokens[n] = 0;
}

}  // namespace mt::data
