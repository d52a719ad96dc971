#pragma once
// The backend over the generation engine (src/inference): a KV cache, continuous batching
// (concurrent requests share each forward pass), and the model on the CPU or the GPU. The engine
// steps on a thread of its own: generate() queues a request and relays its tokens as they come;
// the loop takes what was queued (and cancelled) since the last step, applies it and steps
// (step_work.h). Exactly what `megatron generate` computes for the same prompt, sampling settings
// and seed; token log-probabilities are worked out on the model's device (ops::token_logprobs).
//
// Tensor parallelism: on rank 0 of a `megatron launch` job, with the job's world, the loop
// broadcasts each step's work to the other ranks (which run follow_engine) before stepping, and
// sends a heartbeat while idle, so that they never wait on it longer than ~100 ms. A failed
// broadcast or step (a rank gone, a device error) is fatal: waiting requests get 503 and
// fatal_error() tells the server to stop.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "inference/engine.h"
#include "serve/backend.h"
#include "serve/step_work.h"
#include "training/inference_load.h"

namespace mt::serve {

class EngineBackend final : public Backend {
 public:
  // `tp`: the world of a tensor-parallel job, on its rank 0 (null: a single rank).
  EngineBackend(InferenceModel model, const inference::EngineOptions& opts, comm::Communicator* tp = nullptr);
  // Stops the loop (telling the other ranks to stop too); requests still running are abandoned.
  ~EngineBackend() override;
  EngineBackend(const EngineBackend&) = delete;
  EngineBackend& operator=(const EngineBackend&) = delete;

  const data::Tokenizer& tokenizer() const override { return *m_.tokenizer; }
  int64_t context_length() const override { return context_; }
  int64_t vocab_size() const override { return engine_->vocab_size(); }
  GenerateResult generate(const GenerateRequest& r, const TokenCallback& on_token,
                          const StopCheck& should_stop) override;
  std::string fatal_error() const override;

 private:
  struct Mailbox;
  struct Queued {
    std::shared_ptr<Mailbox> box;
    inference::Request req;
  };
  void loop();
  // Waits (up to the heartbeat) for something to do, then takes the queued work.
  StepWork take_work(std::vector<std::shared_ptr<Mailbox>>& boxes);
  void cancel(const std::shared_ptr<Mailbox>& box);
  void set_fatal(const std::string& why);

  InferenceModel m_;
  int64_t context_ = 0;
  std::unique_ptr<inference::Engine> engine_;
  comm::Communicator* tp_ = nullptr;
  std::mutex mu_;  // guards queued_, cancels_, stop_
  std::condition_variable wake_;
  std::deque<Queued> queued_;
  std::vector<std::shared_ptr<Mailbox>> cancels_;
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  mutable std::mutex fatal_mu_;
  std::string fatal_;
  std::thread thread_;
};

}  // namespace mt::serve
