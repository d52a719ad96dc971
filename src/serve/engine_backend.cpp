#include "serve/engine_backend.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/error.h"
#include "core/log.h"
#include "serve/request.h"

namespace mt::serve {
namespace {

// One request's mailbox between the engine's thread (which fills it in the callbacks) and the
// server thread waiting in generate(). Shared, so a request cancelled and left by its server
// thread can still be finished by the engine.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int32_t> tokens;
  bool done = false;
  inference::FinishReason reason = inference::FinishReason::Length;
};

}  // namespace

EngineBackend::EngineBackend(InferenceModel model, const inference::EngineOptions& opts)
    : m_(std::move(model)), context_(m_.args.model.seq_length) {
  MT_CHECK(m_.model && m_.tokenizer, "EngineBackend: a model and its tokenizer are needed");
  engine_ = std::make_unique<inference::Engine>(*m_.model, opts);
  context_ = std::min(context_, engine_->max_seq_len());
  thread_ = std::thread([this] { loop(); });
}

EngineBackend::~EngineBackend() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void EngineBackend::loop() {
  while (!stop_) {
    try {
      // Sleeps while idle; wakes on submit/cancel, and every 100 ms to see stop_.
      if (engine_->wait_for_work(std::chrono::milliseconds(100))) engine_->step();
    } catch (const std::exception& e) {
      // A failing step (a device error) is reported; the requests it held never finish, and
      // their server threads give up at their deadlines.
      log_warn("serve: generation step failed: {}", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

GenerateResult EngineBackend::generate(const GenerateRequest& r, const TokenCallback& on_token,
                                       const StopCheck& should_stop) {
  if (r.logprobs)
    throw RequestError(400, "logprobs are not computed by the generation engine; start the server with --device cpu "
                            "(without --engine) for them");
  GenerateResult out;
  auto box = std::make_shared<Mailbox>();
  inference::Request q;
  q.prompt = r.prompt;
  q.max_new_tokens = r.max_tokens;
  // Megatron's greedy is top_k = 1: the argmax, the same one temperature 0 picks.
  q.sampling = {r.top_k == 1 ? 0.f : r.temperature, r.top_k == 1 ? 0 : r.top_k, r.top_p, r.seed};
  if (r.stop_id >= 0) q.stop_tokens = {r.stop_id};
  q.on_token = [box](inference::RequestId, int32_t t) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->tokens.push_back(t);
    box->cv.notify_one();
  };
  q.on_done = [box](inference::RequestId, const inference::Completion& c) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->done = true;
    box->reason = c.reason;
    box->cv.notify_one();
  };
  const inference::RequestId id = engine_->submit(std::move(q));
  for (;;) {
    std::deque<int32_t> got;
    bool done = false;
    inference::FinishReason reason;
    {
      std::unique_lock<std::mutex> lock(box->mu);
      box->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return box->done || !box->tokens.empty(); });
      got.swap(box->tokens);
      done = box->done;
      reason = box->reason;
    }
    for (int32_t t : got)
      if (!on_token(Token{t, 0.f})) {
        engine_->cancel(id);
        out.finish = Finish::Stopped;
        return out;
      }
    if (done) {
      out.finish = reason == inference::FinishReason::StopToken  ? Finish::StopToken
                   : reason == inference::FinishReason::Cancelled ? Finish::Cancelled
                                                                  : Finish::Length;
      return out;
    }
    if (should_stop()) {
      engine_->cancel(id);
      out.finish = Finish::Cancelled;
      return out;
    }
  }
}

}  // namespace mt::serve
