#include "inference/engine.h"

#include <algorithm>

#include "core/error.h"
#include "inference/model_runner.h"
#include "model/gpt_model.h"

namespace mt::inference {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length: return "length";
    case FinishReason::StopToken:
    case FinishReason::StopString: return "stop";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "unknown";
}

struct Engine::Sequence {
  RequestId id = 0;
  Request req;
  int64_t slot = -1;
  int64_t prefilled = 0;  // prompt tokens already in the cache
  Completion out;
  bool cancelled = false;
  int64_t length() const { return static_cast<int64_t>(req.prompt.size() + out.tokens.size()); }
};

Engine::Engine(model::GPTModel& model, const EngineOptions& opts) : opts_(opts) {
  if (opts_.max_batch < 1) fail("the engine needs at least one KV cache slot (max batch {})", opts_.max_batch);
  if (opts_.max_step_tokens < opts_.max_batch)
    fail("tokens per step ({}) must be at least the batch size ({}): every running request decodes each step",
         opts_.max_step_tokens, opts_.max_batch);
  const int64_t len = opts_.max_seq_len > 0 ? opts_.max_seq_len : model.config().seq_length;
  runner_ = std::make_unique<ModelRunner>(model, opts_.max_batch, len, opts_.cuda_graphs,
                                          opts_.small_rows_gemv);
  vocab_ = runner_->vocab();
  slots_.resize(static_cast<size_t>(opts_.max_batch));
}

Engine::~Engine() = default;

int64_t Engine::max_seq_len() const { return runner_->max_len(); }
int64_t Engine::vocab_size() const { return vocab_; }

RequestId Engine::submit(Request r) {
  const int64_t n = static_cast<int64_t>(r.prompt.size()), ctx = runner_->max_len();
  if (n == 0) fail("the prompt is empty: give at least one token");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab_)
      fail("prompt token {} (at {}) is outside the vocabulary of {}", r.prompt[i], i, vocab_);
  if (n > ctx) fail("the prompt is {} tokens but the context is {}: shorten the prompt", n, ctx);
  if (r.max_new_tokens < 0) fail("max new tokens must be >= 0 (got {})", r.max_new_tokens);
  if (r.max_new_tokens > ctx - n)
    fail("prompt ({} tokens) + max new tokens ({}) exceeds the context of {} tokens: ask for {} or fewer", n,
         r.max_new_tokens, ctx, ctx - n);
  check_sampling(r.sampling, "");
  if (!r.stop_strings.empty() && !opts_.decode) fail("stop strings need a tokenizer to decode with; this engine has none");
  auto s = std::make_unique<Sequence>();
  s->req = std::move(r);
  s->out.prompt_tokens = n;
  std::lock_guard<std::mutex> g(mu_);
  s->id = next_id_++;
  const RequestId id = s->id;
  pending_.push_back(std::move(s));
  work_.notify_all();
  return id;
}

void Engine::cancel(RequestId id) {
  std::lock_guard<std::mutex> g(mu_);
  cancelled_.push_back(id);
  work_.notify_all();
}

bool Engine::wait_for_work(std::chrono::milliseconds timeout) {
  const bool running = std::any_of(slots_.begin(), slots_.end(), [](const auto& s) { return s != nullptr; });
  std::unique_lock<std::mutex> g(mu_);
  if (running || !pending_.empty() || !cancelled_.empty()) return true;
  work_.wait_for(g, timeout, [&] { return !pending_.empty() || !cancelled_.empty(); });
  return !pending_.empty() || !cancelled_.empty();
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> g(mu_);
  if (!pending_.empty()) return false;
  return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s == nullptr; });
}

void Engine::finish(Sequence& s, FinishReason why) {
  s.out.reason = why;
  std::unique_ptr<Sequence> done;
  if (s.slot >= 0) done = std::move(slots_[static_cast<size_t>(s.slot)]);
  if (s.req.on_done) s.req.on_done(s.id, s.out);
}

// Moves waiting requests into free slots (first come, first served), and applies cancellations.
void Engine::admit() {
  std::vector<std::unique_ptr<Sequence>> dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (RequestId id : cancelled_) {
      for (auto& s : slots_)
        if (s && s->id == id) s->cancelled = true;
      for (auto it = pending_.begin(); it != pending_.end();)
        if ((*it)->id == id) {
          dropped.push_back(std::move(*it));
          it = pending_.erase(it);
        } else {
          ++it;
        }
    }
    cancelled_.clear();
    for (size_t i = 0; i < slots_.size() && !pending_.empty(); ++i) {
      if (slots_[i]) continue;
      slots_[i] = std::move(pending_.front());
      pending_.pop_front();
      slots_[i]->slot = static_cast<int64_t>(i);
    }
  }
  for (auto& s : dropped) finish(*s, FinishReason::Cancelled);
  for (auto& s : slots_)
    if (s && s->cancelled) finish(*s, FinishReason::Cancelled);
  for (auto& s : slots_)  // nothing to generate (or to score): done before any pass
    if (s && s->req.max_new_tokens == 0 && !(s->req.logprobs && s->req.prompt.size() > 1))
      finish(*s, FinishReason::Length);
}

bool Engine::check_stop(Sequence& s, int32_t t) {
  const Request& r = s.req;
  if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), t) != r.stop_tokens.end()) {
    finish(s, FinishReason::StopToken);
    return true;
  }
  if (!r.stop_strings.empty() && find_stop(opts_.decode(s.out.tokens), r.stop_strings, &s.out.stop_string) !=
                                     std::string::npos) {
    finish(s, FinishReason::StopString);
    return true;
  }
  if (static_cast<int64_t>(s.out.tokens.size()) >= r.max_new_tokens || s.length() >= runner_->max_len()) {
    finish(s, FinishReason::Length);
    return true;
  }
  return false;
}

bool Engine::step() {
  admit();
  // Decode rows first (one per generating request), then prompt chunks in slot order within the
  // step's token budget. Logit rows: first the sampled ones, then prompt rows scored for logprobs.
  StepBatch b;
  std::vector<Sequence*> sampled;   // the sequence of each sampled logit row
  std::vector<Sequence*> scored;    // the sequence of each scored prompt row
  std::vector<int32_t> score_rows, score_ids;  // ... its row, and the prompt token it scores
  std::vector<Sequence*> scored_only;  // prompts scored with nothing to generate: done after the pass
  auto add = [&](Sequence& s, int32_t token, int64_t position) {
    b.tokens.push_back(token);
    b.slots.push_back(static_cast<int32_t>(s.slot));
    b.positions.push_back(static_cast<int32_t>(position));
  };
  for (auto& s : slots_) {
    if (!s || s->prefilled < static_cast<int64_t>(s->req.prompt.size())) continue;
    add(*s, s->out.tokens.back(), s->length() - 1);
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    sampled.push_back(s.get());
  }
  for (auto& s : slots_) {
    const int64_t n = s ? static_cast<int64_t>(s->req.prompt.size()) : 0;
    if (!s || s->prefilled >= n) continue;
    const int64_t budget = opts_.max_step_tokens - static_cast<int64_t>(b.tokens.size());
    if (budget <= 0) break;
    const int64_t take = std::min(budget, n - s->prefilled);
    for (int64_t p = s->prefilled; p < s->prefilled + take; ++p) {
      add(*s, s->req.prompt[static_cast<size_t>(p)], p);
      if (s->req.logprobs && p + 1 < n) {  // this row predicts the prompt's next token
        score_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
        score_ids.push_back(s->req.prompt[static_cast<size_t>(p + 1)]);
        scored.push_back(s.get());
      }
    }
    s->prefilled += take;
    if (s->prefilled == n && s->req.max_new_tokens == 0) {
      scored_only.push_back(s.get());
    } else if (s->prefilled == n) {  // the prompt's last token gives the first new one
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
      sampled.push_back(s.get());
    }
  }
  b.logit_rows.insert(b.logit_rows.end(), score_rows.begin(), score_rows.end());
  if (!b.tokens.empty()) {
    // Greedy rows take the device's argmax; the logits come to the host only when a row samples.
    bool any_sampling = false;
    for (const Sequence* s : sampled) any_sampling = any_sampling || s->req.sampling.temperature > 0.f;
    const StepOutput o = runner_->step(b, any_sampling);
    std::vector<int32_t> chosen(sampled.size());
    bool any_logprobs = !scored.empty();
    for (size_t r = 0; r < sampled.size(); ++r) {
      const Sequence& s = *sampled[r];
      const SamplingParams& sp = s.req.sampling;
      chosen[r] = o.argmax[r];
      if (sp.temperature > 0.f) {
        const int64_t V = o.logits.dim(1);
        const float* row = o.logits.data<float>() + static_cast<int64_t>(r) * V;
        chosen[r] = sample_token(std::vector<float>(row, row + V), sp.temperature, sp.top_k, sp.top_p,
                                 sampling_uniform(sp.seed, static_cast<int64_t>(s.out.tokens.size())));
      }
      any_logprobs = any_logprobs || s.req.logprobs;
    }
    // Logprobs of the chosen tokens and the scored prompt tokens, in the rows' order, in one pass
    // on the device over this step's logits.
    std::vector<float> lp;
    if (any_logprobs) {
      std::vector<int32_t> ids = chosen;
      ids.insert(ids.end(), score_ids.begin(), score_ids.end());
      lp = runner_->token_logprobs(ids);
    }
    for (size_t i = 0; i < scored.size(); ++i) scored[i]->out.prompt_logprobs.push_back(lp[sampled.size() + i]);
    for (size_t r = 0; r < sampled.size(); ++r) {
      Sequence& s = *sampled[r];
      const int32_t t = chosen[r];
      const float l = s.req.logprobs ? lp[r] : 0.f;
      s.out.tokens.push_back(t);
      if (s.req.logprobs) s.out.logprobs.push_back(l);
      if (s.req.on_token) s.req.on_token(s.id, t, l);
      check_stop(s, t);  // may free the slot (and s with it)
    }
    for (Sequence* s : scored_only) finish(*s, FinishReason::Length);
  }
  return !idle();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

}  // namespace mt::inference
