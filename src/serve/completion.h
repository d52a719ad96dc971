#pragma once
// One prompt of a parsed request through a backend: tokenized and checked against the limits
// (prepare), then generated with its text assembled and stop strings applied (run_completion).
// Shared by both endpoints, streaming or not.
#include <functional>
#include <string>
#include <vector>

#include "serve/backend.h"
#include "serve/request.h"

namespace mt::serve {

struct PreparedPrompt {
  std::string text;          // the prompt's text (token prompts: their decoding)
  std::vector<int32_t> ids;  // what the model sees
  bool empty_text = false;   // the ids are only the start-of-document token
  int64_t max_tokens = 0;    // fits the context
};

// Tokenizes every prompt and checks it; throws RequestError (400) naming the problem.
std::vector<PreparedPrompt> prepare(const ParsedRequest& r, const Backend& b, const Limits& l);

struct Completion {
  std::vector<int32_t> tokens;          // generated ids (up to the one completing a stop string)
  std::vector<float> logprobs;          // per generated token, when asked
  std::vector<float> prompt_logprobs;   // when asked
  std::string text;                     // generated text, cut before a stop string
  Finish finish = Finish::Length;
  bool stop_string = false;             // ended by a stop string
  bool client_left = false;             // on_piece returned false
};

// "stop" (stop token or string), "length", or "cancelled".
const char* finish_reason(const Completion& c);

// Called with each piece of final text as it forms; false means the client is gone.
using PieceCallback = std::function<bool(const std::string& piece)>;
Completion run_completion(Backend& b, const ParsedRequest& r, const PreparedPrompt& p, uint64_t seed,
                          const StopCheck& should_stop, const PieceCallback& on_piece);

}  // namespace mt::serve
