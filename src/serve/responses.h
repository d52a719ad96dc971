#pragma once
// The JSON bodies `megatron serve` answers with: Megatron's /api response, OpenAI's completion
// object and its streamed chunks, and errors. Text is dumped with invalid UTF-8 replaced (a
// byte-level tokenizer can generate a partial character), so a response never fails to encode.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/completion.h"

namespace mt::serve {

std::string dump_json(const nlohmann::json& j);
// {"error": {"message": ..., "type": ..., "code": status}} (OpenAI's shape; Megatron clients read the text).
std::string error_body(int status, const std::string& message);

// {"text": [prompt + generation], "tokens": [...], "segments": [...], "logprobs"?: [...]}.
nlohmann::json megatron_response(const ParsedRequest& r, const std::vector<PreparedPrompt>& prompts,
                                 const std::vector<Completion>& done, const data::Tokenizer& tok);

struct CompletionMeta {
  std::string id;     // "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};
nlohmann::json openai_response(const CompletionMeta& m, const ParsedRequest& r,
                               const std::vector<PreparedPrompt>& prompts, const std::vector<Completion>& done);
// One server-sent event holding a chunk of choice 0; finish_reason empty means null.
std::string openai_chunk_event(const CompletionMeta& m, const std::string& text, const std::string& finish_reason);
std::string openai_usage_event(const CompletionMeta& m, int64_t prompt_tokens, int64_t completion_tokens);
inline const char* kDoneEvent = "data: [DONE]\n\n";

}  // namespace mt::serve
