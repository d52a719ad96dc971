#include "data/preprocess_merge.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/indexed_dataset.h"

namespace mt::data {

namespace fs = std::filesystem;

std::vector<std::string> expand_merge_inputs(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& item : items) {
    if (fs::is_directory(item)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(item)) {
        if (e.path().extension() != ".idx") continue;
        std::string prefix = (e.path().parent_path() / e.path().stem()).string();
        if (fs::is_regular_file(bin_path(prefix))) found.push_back(prefix);
      }
      if (found.empty()) fail("--merge {}: the directory holds no .bin/.idx pairs", item);
      std::sort(found.begin(), found.end());
      out.insert(out.end(), found.begin(), found.end());
    } else {
      // Accept "X", "X.idx" or "X.bin" for the prefix X.
      std::string prefix = item;
      for (const char* ext : {".idx", ".bin"}) {
        if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ext) == 0) prefix.resize(prefix.size() - 4);
      }
      // A present but non-regular file (FIFO, device, directory) is named as such.
      for (const std::string& f : {idx_path(prefix), bin_path(prefix)}) {
        std::error_code ec;
        if (fs::exists(f, ec)) require_regular_file(f, "--merge " + item);
      }
      if (!indexed_dataset_exists(prefix)) {
        fail("--merge {}: need both {} and {}", item, idx_path(prefix), bin_path(prefix));
      }
      out.push_back(prefix);
    }
  }
  return out;
}

void merge_datasets(const std::vector<std::string>& prefixes, const std::string& output_prefix) {
  MT_CHECK(!prefixes.empty(), "nothing to merge");
  for (const auto& p : prefixes) {
    if (fs::exists(idx_path(p)) && fs::exists(idx_path(output_prefix)) &&
        fs::equivalent(idx_path(p), idx_path(output_prefix))) {
      fail("--output-prefix {} is also a --merge input; write the merge to a new prefix", output_prefix);
    }
  }
  const DType dtype = IndexedDataset(prefixes.front()).dtype();
  IndexedDatasetWriter w(output_prefix, dtype);
  for (const auto& p : prefixes) w.add_index(p);
  w.finalize();
  log_info("merged {} datasets into {}: {} documents, {} sequences, {} tokens ({})", prefixes.size(),
           output_prefix, w.num_documents(), w.num_sequences(), w.num_tokens(), dtype_name(dtype));
}

}  // namespace mt::data
