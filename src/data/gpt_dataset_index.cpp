// GPTDataset's index arithmetic (gpt_dataset.py and helpers.cpp), step for step, so that the
// same seed and data give Megatron-LM's sample order.
#include <cstring>
#include <limits>

#include "core/error.h"
#include "data/gpt_dataset.h"

namespace mt::data::gpt_index {

int64_t num_epochs(int64_t tokens_per_epoch, int64_t num_samples, int64_t seq_length) {
  if (num_samples < 0) return 1;
  MT_CHECK(tokens_per_epoch > 0, "an epoch without tokens");
  const int64_t requested = num_samples * seq_length + 1;  // +1: add_extra_token_to_sequence
  // Megatron's loop adds one epoch at a time; the division gives the same count.
  return std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
}

std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    const int64_t n = end - begin;
    std::vector<int32_t> idx(static_cast<size_t>(n * num_epochs));
    for (int64_t e = 0; e < num_epochs; ++e) {
      for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(e * n + i)] = static_cast<int32_t>(begin + i);
    }
    rng.shuffle(idx.data(), static_cast<int64_t>(idx.size()));
    return idx;
  }
  std::vector<int32_t> first = build_document_index(begin, end, num_epochs - 1, rng, false);
  const std::vector<int32_t> last = build_document_index(begin, end, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

namespace {

template <typename T>
void fill_sample_index(const std::vector<int32_t>& sizes, const std::vector<int32_t>& doc_index,
                       int64_t seq_length, int64_t num_samples, T* out) {
  const int64_t last_doc = static_cast<int64_t>(doc_index.size()) - 1;
  int64_t sample = 0, doc_i = 0, offset = 0;
  out[0] = 0;
  out[1] = 0;
  ++sample;
  while (sample <= num_samples) {
    int64_t remaining = seq_length + 1;
    while (remaining != 0) {
      const int64_t doc_len = sizes[static_cast<size_t>(doc_index[static_cast<size_t>(doc_i)])] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        // The sample ends inside this document; the next one starts on its last token (the
        // one-token overlap), hence the -1.
        offset += remaining + doc_len - 1;
        remaining = 0;
      } else {
        if (doc_i == last_doc) {
          MT_CHECK(sample == num_samples, "ran out of documents at sample {} of {}", sample, num_samples);
          offset = sizes[static_cast<size_t>(doc_index[static_cast<size_t>(doc_i)])] - 1;
          break;
        }
        ++doc_i;
        offset = 0;
      }
    }
    out[2 * sample] = static_cast<T>(doc_i);
    out[2 * sample + 1] = static_cast<T>(offset);
    ++sample;
  }
}

}  // namespace

NpyArray build_sample_index(const std::vector<int32_t>& sizes, const std::vector<int32_t>& doc_index,
                            int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch) {
  MT_CHECK(seq_length > 1 && num_epochs > 0 && tokens_per_epoch > 1, "seq {} epochs {} tokens {}",
           seq_length, num_epochs, tokens_per_epoch);
  const int64_t num_samples = (num_epochs * tokens_per_epoch - 1) / seq_length;
  int64_t max_value = static_cast<int64_t>(doc_index.size());
  for (int32_t s : sizes) max_value = std::max<int64_t>(max_value, s);
  const bool narrow = max_value <= std::numeric_limits<int32_t>::max();
  NpyArray out(narrow ? "<i4" : "<i8", {num_samples + 1, 2});
  // Filled in place: a temporary and a copy doubled the page faults of arrays of tens of MB,
  // which were most of a --mock-data run's start-up.
  if (narrow) {
    fill_sample_index(sizes, doc_index, seq_length, num_samples, reinterpret_cast<int32_t*>(out.mutable_bytes()));
  } else {
    fill_sample_index(sizes, doc_index, seq_length, num_samples, reinterpret_cast<int64_t*>(out.mutable_bytes()));
  }
  return out;
}

namespace {

template <typename T>
void fill_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng, T* idx) {
  for (int64_t i = 0; i < total_size; ++i) idx[i] = static_cast<T>(i);
  rng.shuffle(idx, num_samples);
  if (num_samples != total_size) rng.shuffle(idx + num_samples, total_size - num_samples);
}

}  // namespace

NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng) {
  const bool narrow = total_size < static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1;
  NpyArray out(narrow ? "<u4" : "<i8", {total_size});
  if (narrow) {
    fill_shuffle_index(num_samples, total_size, rng, reinterpret_cast<uint32_t*>(out.mutable_bytes()));
  } else {
    fill_shuffle_index(num_samples, total_size, rng, reinterpret_cast<int64_t*>(out.mutable_bytes()));
  }
  return out;
}

}  // namespace mt::data::gpt_index
