#pragma once
// `megatron generate --prompts-file FILE.jsonl`: one JSON object per line, {"prompt": "text"},
// optionally with per-prompt overrides of the command's flags: "max_new_tokens", "temperature",
// "top_k", "top_p", "seed", "stop" (a string or a list of strings). Blank lines are skipped.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mt {

struct PromptLine {
  std::string prompt;
  std::optional<int64_t> max_new_tokens, top_k;
  std::optional<float> temperature, top_p;
  std::optional<uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
};

// Parses one line (`where`: "FILE:LINE", for the messages). Throws mt::Error naming `where` and
// the field for a line that is not an object with a string "prompt", or a field of the wrong type
// or range. Unknown fields are refused (a misspelt override would be silently ignored otherwise).
PromptLine parse_prompt_line(const std::string& line, const std::string& where);

// Reads every non-blank line of the file (checked to be a regular file first).
std::vector<PromptLine> read_prompts_file(const std::string& path);

}  // namespace mt
