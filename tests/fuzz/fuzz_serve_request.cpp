// libFuzzer target: the JSON bodies of `megatron serve` (PUT /api and POST /v1/completions).
// The first byte picks the endpoint; the rest is the body. A refusal is a RequestError with a
// 4xx status; anything accepted must respect the limits it was parsed against (prompt count,
// token ids in the vocabulary, token counts under the caps, sampling values in range), and the
// token limits must hand back a count that fits the context. A violation aborts (a finding).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "serve/request.h"

namespace sv = mt::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool megatron = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  sv::Limits l;
  l.context = 64;
  l.max_prompt_tokens = 48;
  l.max_tokens = 32;
  l.vocab = 1000;
  sv::ParsedRequest r;
  try {
    r = megatron ? sv::parse_megatron_request(body, l) : sv::parse_openai_request(body, l);
  } catch (const sv::RequestError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
    return 0;
  }
  if (r.prompts.empty() || static_cast<int64_t>(r.prompts.size()) > l.max_prompts) std::abort();
  for (const sv::Prompt& p : r.prompts) {
    if (p.is_tokens && (p.ids.empty() || static_cast<int64_t>(p.ids.size()) > l.max_prompt_tokens)) std::abort();
    for (int32_t id : p.ids)
      if (id < 0 || id >= l.vocab) std::abort();
  }
  if (r.max_tokens < 0 || r.max_tokens > l.max_tokens) std::abort();
  if (!(r.temperature >= 0 && r.temperature <= 100) || !(r.top_p > 0 && r.top_p <= 1) || r.top_k < 0) std::abort();
  if (r.stream && r.prompts.size() != 1) std::abort();
  for (const std::string& s : r.stop)
    if (s.empty()) std::abort();
  if (r.stop_token && (*r.stop_token < 0 || *r.stop_token >= l.vocab)) std::abort();
  // Every prompt length against the limits: what comes back fits the context.
  for (int64_t n : {int64_t{1}, int64_t{20}, int64_t{48}, int64_t{49}, int64_t{64}}) {
    try {
      const int64_t gen = sv::check_token_limits(n, r, l);
      if (gen < 0 || n + gen > l.context || n > l.max_prompt_tokens) std::abort();
    } catch (const sv::RequestError& e) {
      if (e.status != 400) std::abort();
    }
  }
  return 0;
}
