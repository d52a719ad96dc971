#include "data/preprocess_args.h"

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/suggest.h"

namespace mt::data {

namespace {

struct Flag {
  const char* name;
  const char* arg;  // "" for a switch, "..." for one or more values
  const char* help;
};

const Flag kFlags[] = {
    {"--input", "PATH...", "JSONL input files or glob patterns; *.gz is read with zlib, *.zst with libzstd"},
    {"--json-keys", "KEY...", "JSON keys to tokenize, one output per key (default: text)"},
    {"--output-prefix", "PREFIX", "writes PREFIX_{key}_document.bin/.idx"},
    {"--tokenizer-type", "TYPE", "GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, TikTokenizer, NullTokenizer"},
    {"--vocab-file", "PATH", "vocabulary (GPT2BPETokenizer)"},
    {"--merge-file", "PATH", "BPE merges (GPT2BPETokenizer)"},
    {"--tokenizer-model", "PATH", "tokenizer.json / SentencePiece model / HF directory"},
    {"--vocab-size", "N", "vocabulary size (NullTokenizer; TikTokenizer, default 131072)"},
    {"--tiktoken-pattern", "v1|v2", "TikTokenizer's pre-tokenization pattern (default v2)"},
    {"--tiktoken-num-special-tokens", "N", "TikTokenizer's special-token ids before the vocabulary (default 1000)"},
    {"--tokenizer-special-tokens", "TOKEN...", "TikTokenizer's special tokens (default <unk> <s> </s> <mask> <pad> <cls> <sep>)"},
    {"--append-eod", "", "append the tokenizer's EOD id to every non-empty document"},
    {"--workers", "N", "tokenizer threads (default: one per hardware thread, at most 4 per hardware thread); output does not depend on it"},
    {"--partitions", "N", "order documents like Megatron's N-partition run (round-robin over lines)"},
    {"--keep-sequential-samples", "", "with --partitions, keep the input order (as Megatron does)"},
    {"--log-interval", "N", "print progress every N documents (default 1000)"},
    {"--skip-malformed-lines", "", "skip (and count) lines that are not valid JSON documents instead of stopping"},
    {"--merge", "PREFIX...", "merge existing datasets (prefixes, or directories of them) into --output-prefix"},
    {"--help", "", "show this help"},
};

// Megatron flags we recognise but do not implement, with the reason.
const std::pair<const char*, const char*> kUnsupported[] = {
    {"--split-sentences", "sentence splitting needs NLTK's punkt model; give pre-split sentences as a JSON list of strings instead"},
    {"--keep-newlines", "it only applies to --split-sentences, which is not supported"},
    {"--lang", "it only applies to --split-sentences, which is not supported"},
    {"--find-optimal-num-workers", "time a run with --workers N instead"},
    {"--workers-to-check", "it only applies to --find-optimal-num-workers"},
    {"--max-documents", "it only applies to --find-optimal-num-workers"},
    {"--performance-dir", "it only applies to --find-optimal-num-workers"},
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t min) {
  int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec == std::errc::result_out_of_range) fail("{} {} is out of range", flag, v);
  if (ec != std::errc() || p != v.data() + v.size() || x < min) {
    fail("{} expects an integer >= {} (got '{}')", flag, min, v);
  }
  return x;
}

// Tokenizing is CPU-bound and every worker holds its own tokenizer (tens of MB for GPT-2's), so
// threads beyond a few per hardware thread only cost memory and start-up time.
constexpr int64_t kWorkersPerThread = 4;
// Each partition keeps three files open per JSON key with write buffers; Megatron's runs use a
// handful of partitions.
constexpr int64_t kMaxPartitions = 256;
constexpr int64_t kFilesPerWriter = 3;

int64_t max_workers() {
  return kWorkersPerThread * std::max<int64_t>(1, std::thread::hardware_concurrency());
}

// The bound on --workers and --partitions, checked on the 64-bit value (never narrowed first).
void check_counts(const PreprocessArgs& a, int64_t workers, int64_t partitions) {
  if (workers > max_workers()) {
    fail("--workers {} is more than {} per hardware thread ({} here): tokenizing is CPU-bound and "
         "each worker holds its own tokenizer; use --workers {} or fewer (default: one per hardware "
         "thread)", workers, kWorkersPerThread, std::thread::hardware_concurrency(), max_workers());
  }
  if (partitions > kMaxPartitions) {
    fail("--partitions {} is above the limit of {}; Megatron's runs use a few partitions", partitions,
         kMaxPartitions);
  }
  rlimit lim{};
  const int64_t files = partitions * static_cast<int64_t>(a.json_keys.size()) * kFilesPerWriter;
  if (!a.keep_sequential_samples && ::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      files + 64 > static_cast<int64_t>(lim.rlim_cur)) {
    fail("--partitions {} with {} JSON key(s) keeps {} files open, more than the open-file limit ({}) "
         "allows; use fewer partitions or raise 'ulimit -n'", partitions, a.json_keys.size(), files,
         lim.rlim_cur);
  }
}

}  // namespace

std::string preprocess_help() {
  std::string s =
      "usage: megatron preprocess --input PATH... --output-prefix PREFIX --tokenizer-type TYPE [flags]\n"
      "       megatron preprocess --merge PREFIX... --output-prefix OUT\n\n"
      "Tokenizes JSONL documents into Megatron's PREFIX_{key}_document.bin/.idx (byte-identical to\n"
      "tools/preprocess_data.py for the same token ids).\n\nflags:\n";
  for (const auto& f : kFlags) {
    s += fmt::format("  {:<30} {}\n", fmt::format("{} {}", f.name, f.arg), f.help);
  }
  return s;
}

PreprocessArgs parse_preprocess_args(const std::vector<std::string>& args) {
  PreprocessArgs a;
  std::vector<std::string> names;
  for (const auto& f : kFlags) names.emplace_back(f.name);
  for (const auto& u : kUnsupported) names.emplace_back(u.first);
  names.emplace_back("--dataset-impl");

  bool saw_keys = false;
  int64_t workers = 0, partitions = 1;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], inline_value;
    bool has_inline = false;
    if (flag.rfind("--", 0) == 0) {
      const auto eq = flag.find('=');
      if (eq != std::string::npos) {
        inline_value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        has_inline = true;
      }
    } else {
      fail("unexpected argument '{}'; flags start with -- (see 'megatron preprocess --help')", flag);
    }
    if (flag == "-h") flag = "--help";
    // Values of a flag: the inline one, else the following words up to the next flag.
    auto values = [&](bool many) {
      std::vector<std::string> v;
      if (has_inline) {
        v.push_back(inline_value);
      } else {
        while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
          v.push_back(args[++i]);
          if (!many) break;
        }
      }
      if (v.empty()) fail("{} needs a value (see 'megatron preprocess --help')", flag);
      return v;
    };
    auto value = [&] { return values(false)[0]; };

    if (flag == "--input") { auto v = values(true); a.inputs.insert(a.inputs.end(), v.begin(), v.end()); }
    else if (flag == "--json-keys") {
      if (!saw_keys) a.json_keys.clear();
      saw_keys = true;
      auto v = values(true);
      a.json_keys.insert(a.json_keys.end(), v.begin(), v.end());
    }
    else if (flag == "--output-prefix") a.output_prefix = value();
    else if (flag == "--tokenizer-type") a.tokenizer.type = value();
    else if (flag == "--vocab-file") a.tokenizer.vocab_file = value();
    else if (flag == "--merge-file") a.tokenizer.merge_file = value();
    else if (flag == "--tokenizer-model") a.tokenizer.tokenizer_model = value();
    else if (flag == "--vocab-size") a.tokenizer.vocab_size = parse_int(flag, value(), 1);
    else if (flag == "--tiktoken-pattern") a.tokenizer.tiktoken_pattern = value();
    else if (flag == "--tiktoken-num-special-tokens") a.tokenizer.tiktoken_num_special_tokens = parse_int(flag, value(), 1);
    else if (flag == "--tokenizer-special-tokens") a.tokenizer.special_tokens = values(true);
    else if (flag == "--append-eod") a.append_eod = true;
    else if (flag == "--workers") workers = parse_int(flag, value(), 1);
    else if (flag == "--partitions") partitions = parse_int(flag, value(), 1);
    else if (flag == "--keep-sequential-samples") a.keep_sequential_samples = true;
    else if (flag == "--log-interval") a.log_interval = parse_int(flag, value(), 1);
    else if (flag == "--skip-malformed-lines") a.skip_malformed_lines = true;
    else if (flag == "--merge") { auto v = values(true); a.merge.insert(a.merge.end(), v.begin(), v.end()); }
    else if (flag == "--help") a.help = true;
    else if (flag == "--dataset-impl") {
      // Older Megatron scripts pass --dataset-impl mmap; that is the only format there is now.
      if (value() != "mmap") fail("--dataset-impl: only 'mmap' exists (Megatron's .bin/.idx format)");
    } else {
      for (const auto& u : kUnsupported) {
        if (flag == u.first) fail("{} is not supported: {}", flag, u.second);
      }
      const std::string s = closest_match(flag, names);
      fail("unknown flag {}{}; run 'megatron preprocess --help' for the list", flag,
           s.empty() ? "" : " (did you mean " + s + "?)");
    }
  }
  if (a.help) return a;

  if (a.output_prefix.empty()) fail("--output-prefix is required (outputs are PREFIX_{{key}}_document.bin/.idx)");
  const auto dir = std::filesystem::path(a.output_prefix).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    fail("--output-prefix {}: directory {} does not exist; create it first", a.output_prefix, dir.string());
  }
  if (!a.merge.empty()) {
    if (!a.inputs.empty()) fail("--merge and --input cannot be combined; merge datasets or tokenize input, not both");
    return a;
  }
  if (a.inputs.empty()) fail("--input is required (JSONL files or glob patterns; see 'megatron preprocess --help')");
  if (a.tokenizer.type.empty()) fail("--tokenizer-type is required (e.g. GPT2BPETokenizer or NullTokenizer)");
  if (a.json_keys.empty()) fail("--json-keys needs at least one key");
  check_counts(a, workers, partitions);
  a.workers = static_cast<int>(workers);  // within int after check_counts
  a.partitions = static_cast<int>(partitions);
  return a;
}

}  // namespace mt::data
