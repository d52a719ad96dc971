#include "serve/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace mt::serve {

float log_prob(const std::vector<float>& logits, int32_t id) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - mx - std::log(sum));
}

GenerateResult CpuBackend::generate(const GenerateRequest& r, const TokenCallback& on_token,
                                    const StopCheck& should_stop) {
  MT_CHECK(!r.prompt.empty() && static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= context_length(),
           "serve: request not validated against the context");
  GenerateResult out;
  // Waits in short slices so that a cancelled or expired request leaves the queue promptly.
  std::unique_lock<std::timed_mutex> lock(mu_, std::defer_lock);
  while (!lock.try_lock_for(std::chrono::milliseconds(50)))
    if (should_stop()) {
      out.finish = Finish::Cancelled;
      return out;
    }
  const int64_t V = vocab_size(), Vp = g_.model->config().vocab_size;
  if (r.logprobs && r.prompt.size() > 1) {
    const int64_t T = static_cast<int64_t>(r.prompt.size());
    Tensor logits = g_.model->logits(r.prompt, 1, T);
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = logits.data<float>() + t * Vp;
      out.prompt_logprobs.push_back(log_prob(std::vector<float>(row, row + V), r.prompt[static_cast<size_t>(t + 1)]));
    }
  }
  if (r.max_tokens == 0) return out;
  if (should_stop()) {
    out.finish = Finish::Cancelled;
    return out;
  }
  // Megatron's greedy is top_k = 1: the argmax, the same one --temperature 0 picks.
  const Sampling s{r.top_k == 1 ? 0.f : r.temperature, r.top_k, r.top_p, r.seed, r.stop_id};
  std::vector<int32_t> ids = r.prompt;
  bool stopped = false, cancelled = false;
  const int64_t n = generate_tokens(*g_.model, ids, V, r.max_tokens, s, [&](int32_t id, const std::vector<float>& l) {
    if (!on_token(Token{id, r.logprobs ? log_prob(l, id) : 0.f})) return !(stopped = true);
    return !(cancelled = should_stop());
  });
  if (stopped) out.finish = Finish::Stopped;
  else if (!ids.empty() && ids.back() == r.stop_id) out.finish = Finish::StopToken;
  else if (cancelled && n < r.max_tokens) out.finish = Finish::Cancelled;
  else out.finish = Finish::Length;
  return out;
}

}  // namespace mt::serve
