#pragma once
// The backend over today's CPU generation code (training/generation_model.h): one request at a
// time under a mutex, a full forward pass per token (no KV cache). Exactly what `megatron
// generate` computes for the same prompt, sampling settings and seed.
#include <mutex>

#include "serve/backend.h"
#include "training/generation_model.h"

namespace mt::serve {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(GenerationModel model) : g_(std::move(model)) {}
  const data::Tokenizer& tokenizer() const override { return *g_.tokenizer; }
  int64_t context_length() const override { return g_.context(); }
  int64_t vocab_size() const override { return g_.vocab(); }
  GenerateResult generate(const GenerateRequest& r, const TokenCallback& on_token,
                          const StopCheck& should_stop) override;

 private:
  GenerationModel g_;
  std::timed_mutex mu_;  // the model's activations are not shared between concurrent passes
};

// log softmax(logits)[id], in double for a vocabulary of any size.
float log_prob(const std::vector<float>& logits, int32_t id);

}  // namespace mt::serve
