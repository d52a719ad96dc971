#pragma once
// The generation engine: serves several requests at once over one model (continuous batching).
//
//   inference::Engine engine(model, {.max_batch = 8});
//   inference::Request r;
//   r.prompt = tokenizer.encode("Hello");
//   r.max_new_tokens = 32;
//   r.on_token = [](RequestId id, int32_t token, float logprob) { ... };  // streaming, per token
//   r.on_done = [](RequestId id, const Completion& c) { ... };     // once, at the end
//   engine.submit(std::move(r));
//   engine.run_until_idle();   // or: while (engine.step()) {}  — a loop another thread feeds
//
// Each step() runs one forward pass over a batch of tokens drawn from every running request:
// one token per request that is decoding, and the next chunk of the prompt of requests that are
// prefilling (prompts of any length, chunked to EngineOptions::max_step_tokens). Requests
// submitted while others decode join at the next step, into a free KV cache slot; a finished
// request frees its slot at once. Outputs do not depend on what else is in the batch beyond
// rounding (tests/inference check batched = one at a time).
//
// Threads: submit() and cancel() may be called from any thread; step()/run_until_idle() from one
// thread at a time, and the callbacks run on that thread, inside step().
// Errors: submit() throws mt::Error (one line naming the problem) for a request the engine
// cannot serve (empty prompt, token ids outside the vocabulary, prompt + max_new_tokens beyond
// the cache's context, bad sampling values, stop strings without EngineOptions::decode).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "inference/sampling.h"

namespace mt::model {
class GPTModel;
}

namespace mt::inference {

class ModelRunner;
using RequestId = int64_t;

enum class FinishReason : uint8_t {
  Length,      // max_new_tokens generated, or the context is full
  StopToken,   // a token of stop_tokens was generated (it is the last token of the output)
  StopString,  // the decoded output contains a stop string (the caller cuts the text there)
  Cancelled,   // cancel()
};
const char* finish_reason_name(FinishReason r);  // "length", "stop", "stop", "cancelled"

struct Completion {
  std::vector<int32_t> tokens;  // the generated tokens (the prompt not included)
  // Request::logprobs: log p(token | everything before it) at temperature 1 over the real
  // vocabulary, per generated token, and per prompt token after the first (prompt_logprobs[i]
  // scores prompt[i + 1]).
  std::vector<float> logprobs, prompt_logprobs;
  FinishReason reason = FinishReason::Length;
  int64_t prompt_tokens = 0;
  std::string stop_string;  // StopString: which one matched
};

// `logprob`: the token's entry of Completion::logprobs (0 unless Request::logprobs).
using TokenCallback = std::function<void(RequestId, int32_t token, float logprob)>;
using DoneCallback = std::function<void(RequestId, const Completion&)>;

struct Request {
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams sampling;      // greedy by default; seed: deterministic per request
  int64_t max_new_tokens = 16;  // >= 0
  std::vector<int32_t> stop_tokens;
  std::vector<std::string> stop_strings;
  // Fill Completion::logprobs and prompt_logprobs (worked out on the model's device: the logits of
  // the prompt's rows go through the output layer too). With max_new_tokens 0 the prompt is only
  // scored.
  bool logprobs = false;
  TokenCallback on_token;  // optional
  DoneCallback on_done;    // optional
};

struct EngineOptions {
  int64_t max_batch = 8;          // KV cache slots: requests running at once
  int64_t max_seq_len = 0;        // per-slot context (prompt + generated); 0: the model's --seq-length
  int64_t max_step_tokens = 2048; // tokens per forward pass (decode tokens first, then prompt chunks)
  // GPU: decode steps replay a CUDA graph per batch size (ModelRunner); falls back to eager steps
  // by itself where a capture fails. Ignored on the CPU and for MoE models.
  bool cuda_graphs = false;
  // GPU: linears of at most 16 rows (decode steps) run the bandwidth-bound GEMV instead of
  // cuBLASLt (ModelRunner; off: cuBLASLt throughout, for comparisons).
  bool small_rows_gemv = true;
  // Detokenizer for stop strings (the generated ids -> text); requests with stop strings need it.
  std::function<std::string(const std::vector<int32_t>&)> decode;
};

class Engine {
 public:
  // The model must outlive the engine; the KV cache is allocated here on the model's device.
  Engine(model::GPTModel& model, const EngineOptions& opts);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RequestId submit(Request r);  // thread-safe; throws mt::Error for a request it cannot serve
  void cancel(RequestId id);    // thread-safe; the request finishes (Cancelled) at the next step
  // One forward pass over the running requests (admitting waiting ones first). Returns whether
  // work remains (requests running or waiting).
  bool step();
  void run_until_idle();
  // Whether nothing is running or waiting. From the stepping thread (it reads the running set).
  bool idle() const;
  // For a serving loop on the stepping thread: returns at once while work is running or waiting,
  // else blocks until submit() or cancel() is called or `timeout` passes. Returns !idle().
  bool wait_for_work(std::chrono::milliseconds timeout);
  int64_t max_seq_len() const;
  int64_t vocab_size() const;  // the tokenizer's (unpadded) vocabulary: valid ids are below it
  ModelRunner& runner() { return *runner_; }  // benches: the decode graphs' GPU time (graph_replay_seconds)

 private:
  struct Sequence;
  void admit();
  void finish(Sequence& s, FinishReason why);
  // After token `t` was appended: whether the request is done, and why.
  bool check_stop(Sequence& s, int32_t t);

  std::unique_ptr<ModelRunner> runner_;
  EngineOptions opts_;
  int64_t vocab_ = 0;
  mutable std::mutex mu_;  // guards pending_, cancelled_, next_id_
  std::condition_variable work_;  // notified by submit() and cancel()
  std::deque<std::unique_ptr<Sequence>> pending_;
  std::vector<RequestId> cancelled_;
  RequestId next_id_ = 1;
  std::vector<std::unique_ptr<Sequence>> slots_;  // [max_batch]; null: free
};

}  // namespace mt::inference
