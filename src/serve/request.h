#pragma once
// The bodies of Megatron's `PUT /api` and OpenAI's `POST /v1/completions`, parsed and checked
// into one form. Everything here is untrusted input: a problem is a RequestError carrying the
// HTTP status (400 for a bad field, 413 for too much) and one line naming the field and the fix.
// Token counts are checked after tokenization by check_token_limits().
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mt::serve {

struct RequestError : std::runtime_error {
  RequestError(int s, const std::string& what) : std::runtime_error(what), status(s) {}
  int status;
};

// The server's caps (its flags) and the model's sizes, which requests are checked against.
struct Limits {
  int64_t context = 0;            // the model's context: prompt + generated tokens
  int64_t max_prompt_tokens = 0;  // --max-prompt-tokens
  int64_t max_tokens = 0;         // --max-tokens-to-generate
  int64_t vocab = 0;              // token ids in a prompt are below it
  int64_t max_prompts = 128;      // prompts per request (Megatron's cap)
};

struct Prompt {
  std::string text;              // as given (for a token prompt: empty)
  std::vector<int32_t> ids;      // token ids as given (for a text prompt: empty until tokenized)
  bool is_tokens = false;
};

enum class Api { Megatron, OpenAI };

struct ParsedRequest {
  Api api = Api::OpenAI;
  std::vector<Prompt> prompts;
  int64_t max_tokens = 16;
  bool max_tokens_given = false;  // a default shrinks to what the context leaves; a given count must fit
  float temperature = 1.f;  // 0 = greedy
  int64_t top_k = 0;
  float top_p = 1.f;        // 1 = all
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;   // stop strings (not part of the returned text)
  std::optional<int64_t> stop_token;  // default: the tokenizer's end-of-document
  bool logprobs = false;
  bool add_bos = false;     // Megatron: prepend the end-of-document token
  bool stream = false;
  bool echo = false;        // OpenAI: the prompt's text before the completion
  bool include_usage = false;  // OpenAI stream_options.include_usage
};

ParsedRequest parse_megatron_request(std::string_view body, const Limits& limits);
ParsedRequest parse_openai_request(std::string_view body, const Limits& limits);

// A prompt of `prompt_tokens` tokens against the limits; returns the tokens to generate for it
// (the request's default shrunk to fit the context, or its own count, which must fit).
int64_t check_token_limits(int64_t prompt_tokens, const ParsedRequest& r, const Limits& limits);

}  // namespace mt::serve
