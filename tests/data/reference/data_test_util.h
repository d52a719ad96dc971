#pragma once
// Helpers shared by the data-layer tests: scratch directories, file bytes, small datasets, and
// running the Python references in this folder (skipped when /usr/bin/python3 or numpy is absent).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

namespace mt::data::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mt_data_test_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
}

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// docs[d][s] = tokens of sequence s of document d.
using Docs = std::vector<std::vector<std::vector<int64_t>>>;

inline void write_dataset(const std::string& prefix, const Docs& docs, DType dtype) {
  IndexedDatasetWriter w(prefix, dtype);
  for (const auto& doc : docs) {
    for (const auto& seq : doc) w.add_item(seq.data(), seq.size());
    w.end_document();
  }
  w.finalize();
}

// `n` one-sequence documents with lengths in [1, max_len] and ids in [0, vocab).
inline Docs random_docs(int n, int max_len, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  Docs docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    std::vector<int64_t> s(1 + g() % static_cast<uint32_t>(max_len));
    for (auto& t : s) t = static_cast<int64_t>(g() % static_cast<uint32_t>(vocab));
    d.push_back(std::move(s));
  }
  return docs;
}

inline std::string reference_script(const std::string& name) {
  return std::string(MT_SOURCE_DIR) + "/tests/data/reference/" + name;
}

inline bool have_python() { return ::access("/usr/bin/python3", X_OK) == 0; }

inline bool have_numpy() {
  static const bool ok = have_python() &&
                         std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

// Runs a reference script with /usr/bin/python3; the test fails if it does not exit 0.
inline void run_reference(const std::string& script, const std::string& args) {
  const std::string cmd = "/usr/bin/python3 " + reference_script(script) + " " + args;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace mt::data::testing
