// `megatron inspect-data`: what the model will read. With pretrain's data flags and --samples it
// builds the same train/valid/test datasets pretrain builds (same index caches) and prints every
// sample as a JSON line; with --info PREFIX it summarises a .bin/.idx dataset, and with
// --document N prints one of its documents.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/checked.h"
#include "core/error.h"
#include "core/log.h"
#include "data/indexed_dataset.h"
#include "data/sample_source.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "training/commands.h"
#include "training/arguments_sections.h"
#include "training/flag_parser.h"

namespace mt {
namespace {

struct InspectOptions {
  data::GPTDataOptions data;
  data::TokenizerOptions tokenizer;
  std::string samples, split_name, info;
  int64_t limit = -1, document = -1;
  bool decode = false;
};

// One JSON line; invalid UTF-8 in decoded text (a byte-level token cut mid-character) is replaced.
void print_line(const nlohmann::json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// "TRAIN,VALID,TEST": the sample count each split is built for, as pretrain derives them.
std::array<int64_t, 3> parse_samples(const std::string& s) {
  std::array<int64_t, 3> out{};
  std::stringstream ss(s);
  std::string part;
  size_t n = 0;
  while (std::getline(ss, part, ',')) {
    if (n == 3) fail("--samples expects TRAIN,VALID,TEST (three counts), got '{}'", s);
    char* end = nullptr;
    const long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v > (int64_t{1} << 48))
      fail("--samples: '{}' is not a sample count (0 to 2^48) in '{}'", part, s);
    out[n++] = v;
  }
  if (n != 3) fail("--samples expects TRAIN,VALID,TEST (three counts), got '{}'", s);
  return out;
}

std::unique_ptr<data::Tokenizer> tokenizer_if_given(const InspectOptions& o) {
  if (o.tokenizer.type.empty()) return nullptr;
  return data::build_tokenizer(o.tokenizer);
}

int print_info(const InspectOptions& o) {
  const data::IndexedDataset ds(o.info);
  if (o.document >= 0) {
    if (o.document >= ds.num_documents())
      fail("--document {}: '{}' holds {} documents (0 to {})", o.document, o.info, ds.num_documents(),
           ds.num_documents() - 1);
    std::vector<int32_t> ids;
    for (int64_t s = ds.document_bound(o.document); s < ds.document_bound(o.document + 1); ++s) {
      const size_t at = ids.size();
      ids.resize(at + static_cast<size_t>(ds.sequence_length(s)));
      ds.read(s, 0, ds.sequence_length(s), ids.data() + at);
    }
    nlohmann::json j = {{"document", o.document}, {"tokens", ids}};
    if (auto tok = tokenizer_if_given(o)) j["text"] = tok->decode(ids);
    print_line(j);
    return 0;
  }
  // Document lengths in power-of-two buckets: [1, 2), [2, 4), ... (empty documents apart).
  std::map<int, int64_t> buckets;
  int64_t empty = 0, min_len = INT64_MAX, max_len = 0;
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    int64_t len = 0;
    for (int64_t s = ds.document_bound(d); s < ds.document_bound(d + 1); ++s) len += ds.sequence_length(s);
    min_len = std::min(min_len, len);
    max_len = std::max(max_len, len);
    if (len == 0) {
      ++empty;
      continue;
    }
    int b = 0;
    while ((int64_t{2} << b) <= len) ++b;
    ++buckets[b];
  }
  nlohmann::json hist = nlohmann::json::array();
  for (auto [b, n] : buckets) hist.push_back({{"from", int64_t{1} << b}, {"below", int64_t{2} << b}, {"documents", n}});
  const int64_t docs = ds.num_documents();
  print_line({{"prefix", o.info},
              {"documents", docs},
              {"sequences", ds.num_sequences()},
              {"tokens", ds.num_tokens()},
              {"dtype", data::dtype_name(ds.dtype())},
              {"empty_documents", empty},
              {"min_document_tokens", docs > 0 ? min_len : 0},
              {"max_document_tokens", max_len},
              {"mean_document_tokens", docs > 0 ? static_cast<double>(ds.num_tokens()) / static_cast<double>(docs) : 0.0},
              {"document_length_histogram", hist}});
  return 0;
}

int print_samples(InspectOptions& o) {
  if (o.samples.empty()) fail("--samples TRAIN,VALID,TEST is required (the sample count each split is built for)");
  if (o.data.seq_length <= 0) fail("--seq-length is required (each sample is seq-length + 1 tokens)");
  const std::array<int64_t, 3> n = parse_samples(o.samples);
  auto tok = tokenizer_if_given(o);
  if (o.decode && !tok) fail("--decode needs the tokenizer flags (--tokenizer-type ...) that made the data");
  if (o.data.mock) {
    if (!tok) fail("--mock-data needs a tokenizer: --tokenizer-type NullTokenizer --vocab-size N, for example");
    o.data.eod = tok->eod();
    o.data.mock_vocab_size = tok->vocab_size();
  }
  const int64_t counts[3] = {n[0], n[1], n[2]};
  data::SplitSources splits = data::build_gpt_datasets(o.data, counts);
  const std::pair<const char*, data::SampleSource*> all[3] = {
      {"train", splits.train.get()}, {"valid", splits.valid.get()}, {"test", splits.test.get()}};
  std::vector<int32_t> buf(static_cast<size_t>(checked_add(o.data.seq_length, int64_t{1}, "--seq-length + 1")));
  for (const auto& [name, src] : all) {
    if (!o.split_name.empty() && o.split_name != name) continue;
    if (!src) continue;
    const int64_t count = o.limit >= 0 ? std::min(o.limit, src->size()) : src->size();
    for (int64_t i = 0; i < count; ++i) {
      src->get(i, buf.data());
      nlohmann::json j = {{"split", name}, {"index", i}, {"tokens", buf}};
      if (o.decode) j["text"] = tok->decode(buf);
      print_line(j);
    }
  }
  return 0;
}

}  // namespace

int inspect_data_main(const std::vector<std::string>& argv) {
  InspectOptions o;
  FlagParser p("inspect-data");
  p.group("data (as pretrain)");
  p.list("--data-path", &o.data.data_path, "PREFIX or W1 PREFIX1 W2 PREFIX2 ...");
  p.list("--train-data-path", &o.data.train_data_path, "data for the train split only");
  p.list("--valid-data-path", &o.data.valid_data_path, "data for the validation split only");
  p.list("--test-data-path", &o.data.test_data_path, "data for the test split only");
  p.value("--split", &o.data.split, "train,valid,test proportions (default 969, 30, 1)");
  p.value("--seq-length", &o.data.seq_length, "sequence length (samples are seq-length + 1 tokens)",
          {1, model::limits::kSeqLength});
  p.value("--seed", &o.data.seed, "random seed of the sample order (default 1234)");
  p.value("--data-cache-path", &o.data.data_cache_path, "where dataset index caches are read and written");
  p.store_true("--mock-data", &o.data.mock, "Megatron's mock GPT dataset");
  p.value("--tokenizer-type", &o.tokenizer.type, "tokenizer (for --decode, --document and --mock-data)",
          {"GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
           "Llama2Tokenizer", "TikTokenizer", "NullTokenizer"});
  p.value("--vocab-file", &o.tokenizer.vocab_file, "GPT-2 encoder.json");
  p.value("--merge-file", &o.tokenizer.merge_file, "GPT-2 vocab.bpe");
  p.value("--tokenizer-model", &o.tokenizer.tokenizer_model, "tokenizer.json / directory / SentencePiece .model");
  p.value("--vocab-size", &o.tokenizer.vocab_size, "vocabulary size (NullTokenizer; TikTokenizer, default 131072)",
          {1, model::limits::kVocab});
  register_tiktoken_flags(p, o.tokenizer);  // as pretrain: datasets tokenized with TikTokenizer decode alike
  p.group("what to print");
  p.value("--samples", &o.samples, "TRAIN,VALID,TEST: the sample count each split is built for (pretrain: "
                                   "iterations x global batch, and the evaluations' samples)");
  p.value("--split-name", &o.split_name, "only this split", {"train", "valid", "test"});
  p.value("--limit", &o.limit, "at most this many samples per split", {0, INT64_MAX});
  p.store_true("--decode", &o.decode, "add each sample's text (needs the tokenizer flags)");
  p.value("--info", &o.info, "summarise the dataset PREFIX (.bin/.idx): documents, tokens, dtype, length histogram");
  p.value("--document", &o.document, "with --info PREFIX: print document N (decoded with the tokenizer flags)",
          {0, INT64_MAX});
  p.parse(argv);
  if (p.help_requested()) {
    std::printf("usage: megatron inspect-data --data-path PREFIX --seq-length S --samples TRAIN,VALID,TEST [flags]\n"
                "       megatron inspect-data --info PREFIX [--document N]\n\n"
                "Prints the samples pretrain would read, one JSON line each: {\"split\": \"train\", \"index\": i, "
                "\"tokens\": [seq-length + 1 ids]}.\n\n%s",
                p.help().c_str());
    return 0;
  }
  // stdout carries the JSON lines only; the dataset builder's progress goes to stderr.
  struct InfoToStderr {
    bool before = set_info_to_stderr(true);
    ~InfoToStderr() { set_info_to_stderr(before); }
  } info_to_stderr;
  if (!o.info.empty()) return print_info(o);
  if (o.document >= 0) fail("--document N needs --info PREFIX (the dataset to read it from)");
  return print_samples(o);
}

}  // namespace mt
