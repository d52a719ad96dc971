#pragma once
// The backend over the generation engine (src/inference): a KV cache, continuous batching
// (concurrent requests share each forward pass), and the model on the CPU or the GPU. The engine
// steps on a thread of its own; generate() submits a request and relays its tokens as they come.
// Exactly what `megatron generate` computes for the same prompt, sampling settings and seed.
// Token log-probabilities are not computed by the engine: a request asking for them gets a 400
// naming `serve --device cpu` without --engine, where CpuBackend answers them.
#include <atomic>
#include <memory>
#include <thread>

#include "inference/engine.h"
#include "serve/backend.h"
#include "training/inference_load.h"

namespace mt::serve {

class EngineBackend final : public Backend {
 public:
  EngineBackend(InferenceModel model, const inference::EngineOptions& opts);
  ~EngineBackend() override;  // stops the engine's thread (requests still running are cancelled)
  EngineBackend(const EngineBackend&) = delete;
  EngineBackend& operator=(const EngineBackend&) = delete;

  const data::Tokenizer& tokenizer() const override { return *m_.tokenizer; }
  int64_t context_length() const override { return context_; }
  int64_t vocab_size() const override { return engine_->vocab_size(); }
  GenerateResult generate(const GenerateRequest& r, const TokenCallback& on_token,
                          const StopCheck& should_stop) override;

 private:
  void loop();

  InferenceModel m_;
  int64_t context_ = 0;
  std::unique_ptr<inference::Engine> engine_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace mt::serve
