#include "serve/engine_backend.h"

#include <chrono>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "serve/request.h"

namespace mt::serve {

// Between the engine's loop (which fills it from the engine's callbacks) and the server thread
// waiting in generate(). Shared, so that a request left by its server thread (cancelled, timed
// out) can still be finished by the engine.
struct EngineBackend::Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Token> tokens;
  bool done = false;
  inference::FinishReason reason = inference::FinishReason::Length;
  std::vector<float> prompt_logprobs;
  std::string refused;  // the engine's reason for refusing the request
  // The loop's own: the engine's id once submitted (0 before), and whether the server thread
  // cancelled it (set under the backend's mu_).
  inference::RequestId id = 0;
  bool cancelled = false;
};

namespace {
// While idle, rank 0 wakes this often: to see stop_, and to tell the other ranks it is alive.
constexpr auto kHeartbeat = std::chrono::milliseconds(100);
}  // namespace

EngineBackend::EngineBackend(InferenceModel model, const inference::EngineOptions& opts, comm::Communicator* tp)
    : m_(std::move(model)), context_(m_.args.model.seq_length), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  MT_CHECK(m_.model && m_.tokenizer, "EngineBackend: a model and its tokenizer are needed");
  MT_CHECK(!tp_ || tp_->rank() == 0, "EngineBackend runs on rank 0 (the others follow_engine)");
  engine_ = std::make_unique<inference::Engine>(*m_.model, opts);
  context_ = std::min(context_, engine_->max_seq_len());
  thread_ = std::thread([this] { loop(); });
}

EngineBackend::~EngineBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string EngineBackend::fatal_error() const {
  std::lock_guard<std::mutex> lock(fatal_mu_);
  return fatal_;
}

void EngineBackend::set_fatal(const std::string& why) {
  log_warn("serve: the generation engine stopped: {}", why);
  std::lock_guard<std::mutex> lock(fatal_mu_);
  fatal_ = why;
  failed_ = true;
}

StepWork EngineBackend::take_work(std::vector<std::shared_ptr<Mailbox>>& boxes) {
  const bool busy = !engine_->idle();
  StepWork w;
  std::unique_lock<std::mutex> lock(mu_);
  if (!busy) wake_.wait_for(lock, kHeartbeat, [&] { return stop_ || !queued_.empty() || !cancels_.empty(); });
  w.shutdown = stop_;
  for (const auto& box : cancels_)
    if (box->id > 0) w.cancel.push_back(box->id);  // else still queued: dropped below
  cancels_.clear();
  for (Queued& q : queued_) {
    if (q.box->cancelled) continue;  // its server thread has gone: nothing to tell the engine
    boxes.push_back(q.box);
    w.fresh.push_back(std::move(q.req));
  }
  queued_.clear();
  return w;
}

void EngineBackend::loop() {
  try {
    for (;;) {
      std::vector<std::shared_ptr<Mailbox>> boxes;
      StepWork w = take_work(boxes);
      if (tp_) broadcast_work(*tp_, w);
      std::vector<std::string> refused;
      const std::vector<inference::RequestId> ids = apply_work(*engine_, w, &refused);
      for (size_t i = 0; i < boxes.size(); ++i) {
        boxes[i]->id = ids[i];
        if (ids[i] != 0) continue;
        std::lock_guard<std::mutex> lock(boxes[i]->mu);
        boxes[i]->refused = refused[i];
        boxes[i]->done = true;
        boxes[i]->cv.notify_one();
      }
      if (w.shutdown) return;
      if (engine_->idle()) continue;
      try {
        engine_->step();
      } catch (const comm::CommError&) {
        throw;
      } catch (const std::exception& e) {
        // One rank: a failing step (a device error) is reported; the requests it held never finish,
        // and their server threads give up at their deadlines. Several: the ranks may no longer
        // agree on what runs, so the server stops.
        if (tp_) throw;
        log_warn("serve: generation step failed: {}", e.what());
        std::this_thread::sleep_for(kHeartbeat);
      }
    }
  } catch (const std::exception& e) {
    set_fatal(e.what());
  }
}

void EngineBackend::cancel(const std::shared_ptr<Mailbox>& box) {
  std::lock_guard<std::mutex> lock(mu_);
  box->cancelled = true;
  cancels_.push_back(box);
  wake_.notify_all();
}

GenerateResult EngineBackend::generate(const GenerateRequest& r, const TokenCallback& on_token,
                                       const StopCheck& should_stop) {
  auto fatal = [&] { return RequestError(503, "the generation engine stopped: " + fatal_error()); };
  if (failed_) throw fatal();
  GenerateResult out;
  auto box = std::make_shared<Mailbox>();
  inference::Request q;
  q.prompt = r.prompt;
  q.max_new_tokens = r.max_tokens;
  // Megatron's greedy is top_k = 1: the argmax, the same one temperature 0 picks.
  q.sampling = {r.top_k == 1 ? 0.f : r.temperature, r.top_k == 1 ? 0 : r.top_k, r.top_p, r.seed};
  if (r.stop_id >= 0) q.stop_tokens = {r.stop_id};
  q.logprobs = r.logprobs;
  q.on_token = [box](inference::RequestId, int32_t t, float logprob) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->tokens.push_back(Token{t, logprob});
    box->cv.notify_one();
  };
  q.on_done = [box](inference::RequestId, const inference::Completion& c) {
    std::lock_guard<std::mutex> lock(box->mu);
    box->done = true;
    box->reason = c.reason;
    box->prompt_logprobs = c.prompt_logprobs;
    box->cv.notify_one();
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back({box, std::move(q)});
  }
  wake_.notify_all();
  for (;;) {
    std::deque<Token> got;
    bool done = false;
    {
      std::unique_lock<std::mutex> lock(box->mu);
      box->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return box->done || !box->tokens.empty(); });
      got.swap(box->tokens);
      done = box->done;
    }
    for (const Token& t : got)
      if (!on_token(t)) {
        cancel(box);
        out.finish = Finish::Stopped;
        return out;
      }
    if (done) {
      if (!box->refused.empty()) throw RequestError(400, box->refused);
      out.finish = box->reason == inference::FinishReason::StopToken  ? Finish::StopToken
                   : box->reason == inference::FinishReason::Cancelled ? Finish::Cancelled
                                                                       : Finish::Length;
      out.prompt_logprobs = box->prompt_logprobs;
      return out;
    }
    if (failed_) throw fatal();
    if (should_stop()) {
      cancel(box);
      out.finish = Finish::Cancelled;
      return out;
    }
  }
}

}  // namespace mt::serve
