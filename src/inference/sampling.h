#pragma once
// Picking the next token from a row of logits: greedy, or sampling with temperature, top-k and
// top-p (nucleus), driven by one uniform number per generated token drawn from the request's
// seed, so a request's output depends on its seed and nothing else (not on the batch it ran in).
#include <cstdint>
#include <string>
#include <vector>

namespace mt::inference {

struct SamplingParams {
  float temperature = 0.f;  // 0: greedy (argmax); else softmax(logits / temperature)
  int64_t top_k = 0;        // keep the k most likely tokens (0: all)
  float top_p = 1.f;        // keep the most likely tokens whose probabilities sum to p, in (0, 1]
  uint64_t seed = 1234;
};

// Throws mt::Error naming the field (`prefix` + "temperature", ...) for values out of range.
void check_sampling(const SamplingParams& p, const std::string& prefix = "--");

// The token picked from logits (the real vocabulary only) with uniform number u in [0, 1).
int32_t sample_token(std::vector<float> logits, float temperature, int64_t top_k, float top_p, float u);

// The uniform number for a request's n-th generated token (n from 0).
float sampling_uniform(uint64_t seed, int64_t n);

// The first position in `text` where any of `stops` occurs, and which one; npos if none.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, std::string* which = nullptr);

}  // namespace mt::inference
