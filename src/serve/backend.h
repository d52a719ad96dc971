#pragma once
// What `megatron serve` needs from a generation engine, and nothing more: a tokenizer, the
// model's context, and a call that generates the tokens of one prompt through a per-token
// callback and can be stopped between tokens (a stop string matched, the client left, the
// request's deadline passed, the server shuts down). The HTTP side (requests, text, stop
// strings, streaming) is engine-independent; an engine plugs in by implementing Backend.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace mt::serve {

// One prompt's generation, as the server validated it. The server tokenizes text prompts (it
// checks their length against the limits first), so a backend sees token ids only.
struct GenerateRequest {
  std::vector<int32_t> prompt;  // non-empty, every id < vocab_size()
  int64_t max_tokens = 16;      // 0 is allowed (scoring the prompt)
  float temperature = 1.f;      // 0 = greedy (argmax)
  int64_t top_k = 0;            // 0 = no top-k filtering
  float top_p = 1.f;            // (0, 1]; 1 = no nucleus filtering
  uint64_t seed = 0;            // draws of the same request and seed repeat exactly
  int32_t stop_id = -1;         // generation ends after this token (-1: none)
  bool logprobs = false;        // fill Token::logprob and GenerateResult::prompt_logprobs
};

struct Token {
  int32_t id = 0;
  float logprob = 0.f;  // log p(id | prefix) under the model's distribution (temperature 1); 0 unless asked
};

enum class Finish {
  Length,     // max_tokens generated
  StopToken,  // stop_id generated
  Stopped,    // the callback returned false (a stop string matched, the client left)
  Cancelled,  // should_stop() said so before the end
};

struct GenerateResult {
  Finish finish = Finish::Length;
  std::vector<float> prompt_logprobs;  // log p(prompt[i+1] | prompt[..i]); only when asked
};

// Called with each new token in order; returning false ends the generation (Finish::Stopped).
using TokenCallback = std::function<bool(const Token&)>;
// Polled while waiting for the model and between tokens; true ends it (Finish::Cancelled).
using StopCheck = std::function<bool()>;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const data::Tokenizer& tokenizer() const = 0;
  virtual int64_t context_length() const = 0;  // prompt + generated tokens must fit
  virtual int64_t vocab_size() const = 0;       // the real vocabulary (token ids below it)
  // Safe to call from several threads at once (a backend serializes or batches as it can).
  virtual GenerateResult generate(const GenerateRequest& r, const TokenCallback& on_token,
                                  const StopCheck& should_stop) = 0;
  // Non-empty once the backend cannot generate any more (a tensor-parallel rank is gone): the
  // server stops, and the process exits with this message.
  virtual std::string fatal_error() const { return {}; }
};

}  // namespace mt::serve
