#pragma once
// Flags of `megatron preprocess` (tools/preprocess_data.py's, plus --merge from
// tools/merge_datasets.py and --skip-malformed-lines).
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::data {

struct PreprocessArgs {
  std::vector<std::string> inputs;              // --input: files or glob patterns (.gz allowed)
  std::vector<std::string> json_keys{"text"};   // --json-keys
  std::string output_prefix;                    // --output-prefix
  TokenizerOptions tokenizer;                   // --tokenizer-type --vocab-file ...
  bool append_eod = false;                      // --append-eod
  int workers = 0;                              // --workers (0: one per hardware thread)
  int partitions = 1;                           // --partitions
  int64_t log_interval = 1000;                  // --log-interval (documents)
  bool keep_sequential_samples = false;         // --keep-sequential-samples
  bool skip_malformed_lines = false;            // --skip-malformed-lines
  std::vector<std::string> merge;               // --merge PREFIX|DIR ...
  bool help = false;
};

// Throws mt::Error naming the flag (with a did-you-mean for unknown ones).
PreprocessArgs parse_preprocess_args(const std::vector<std::string>& args);
std::string preprocess_help();

}  // namespace mt::data
