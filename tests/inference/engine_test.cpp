// The generation engine on the CPU: its logits and greedy tokens against full recomputation,
// batched and continuously batched runs against one prompt at a time, seeded sampling, stops.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <thread>

#include "core/error.h"
#include "engine_support.h"
#include "inference/model_runner.h"
#include "support/error_of.h"

namespace mt::test {
namespace {

using inference::Completion;
using inference::EngineOptions;
using inference::FinishReason;
using inference::Request;

Request greedy(std::vector<int32_t> prompt, int64_t n) {
  Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  return r;
}

// MT_DECODE_STACK=1 on the CPU: the runner hands every batch-1 decode step's layers to
// ops::decode_layer_stack, which runs their ops one by one: the same logits as the layers run by the
// runner itself, for Llama (RoPE, GQA, SwiGLU, RMSNorm) with and without a QKV bias. Families the
// op does not take (GPT-2's LayerNorm, Qwen3's qk-norm, MoE) never reach it. The GPU kernel is
// checked against this op in DecodeStackGpu.
TEST(DecodeStack, CpuRunnerGivesTheLayersLogits) {
  for (const std::string& f : {std::string("llama"), std::string("llama-qkv-bias"), std::string("gpt2"),
                               std::string("qwen3"), std::string("moe")}) {
    model::TransformerConfig c = family_config(f == "llama-qkv-bias" ? "llama" : f);
    if (f == "llama-qkv-bias") c.add_qkv_bias = true;
    model::GPTModel m(c);
    const int64_t V = c.orig_vocab_size;
    setenv("MT_DECODE_STACK", "1", 1);
    inference::ModelRunner stacked(m, 2, 32);
    unsetenv("MT_DECODE_STACK");
    inference::ModelRunner layers(m, 2, 32);
    EXPECT_TRUE(stacked.decode_stack()) << f;
    EXPECT_FALSE(layers.decode_stack()) << f;
    const std::vector<int32_t> prompt = make_prompt(6, 3, V);
    const inference::StepBatch pre = prompt_pass(prompt, 1, 0, 6, {5});
    stacked.forward(pre);
    layers.forward(pre);
    for (int step = 0; step < 5; ++step) {
      const int32_t next = make_prompt(1, 200 + static_cast<uint32_t>(step), V)[0];
      const inference::StepBatch sb{{next}, {1}, {6 + step}, {0}};
      const Tensor got = stacked.forward(sb), want = layers.forward(sb);
      double max_diff = 0, max_abs = 0;
      for (int64_t v = 0; v < V; ++v) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(got.data<float>()[v] - want.data<float>()[v])));
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(want.data<float>()[v])));
      }
      EXPECT_LE(max_diff, 1e-5 * max_abs) << f << " step " << step;
    }
    const bool takes = f == "llama" || f == "llama-qkv-bias";
    EXPECT_EQ(stacked.decode_stack_steps(), takes ? 5 : 0) << f;  // decode steps only, never the prompt
    EXPECT_EQ(layers.decode_stack_steps(), 0) << f;
  }
}

// Prefill in chunks then decode one token at a time through the runner: every step's logits equal
// the last row of a full forward over the sequence so far.
TEST(InferenceRunner, LogitsMatchFullForwardForEveryFamily) {
  for (const std::string& f : families()) {
    model::GPTModel m(family_config(f));
    const int64_t V = m.config().orig_vocab_size, Vp = m.config().vocab_size;
    inference::ModelRunner run(m, 2, 32);
    std::vector<int32_t> ids = make_prompt(9, 1, V);
    // The prompt in two chunks (5 + 4 tokens), in slot 1.
    for (auto [b, e] : {std::pair<int, int>{0, 5}, {5, 9}}) run.forward(prompt_pass(ids, 1, b, e, {e - b - 1}));
    for (int step = 0; step < 6; ++step) {
      const int64_t T = static_cast<int64_t>(ids.size());
      const int32_t next = make_prompt(1, 100 + static_cast<uint32_t>(step), V)[0];
      ids.push_back(next);
      inference::StepBatch sb{{next}, {1}, {static_cast<int32_t>(T)}, {0}};
      const Tensor got = run.forward(sb);
      const Tensor want = m.logits(ids, 1, T + 1);
      const float* w = want.data<float>() + T * Vp;
      double max_diff = 0, max_abs = 0;
      for (int64_t v = 0; v < V; ++v) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(got.data<float>()[v] - w[v])));
        max_abs = std::max(max_abs, static_cast<double>(std::fabs(w[v])));
      }
      EXPECT_LT(max_diff, 1e-4 * std::max(1.0, max_abs)) << f << " step " << step;
    }
  }
}

TEST(InferenceEngine, GreedyEqualsStepwiseArgmaxOfFullForward) {
  for (const std::string& f : families()) {
    model::GPTModel m(family_config(f));
    const std::vector<int32_t> prompt = make_prompt(7, 2, m.config().orig_vocab_size);
    const auto got = run_engine(m, {greedy(prompt, 12)}, {});
    EXPECT_EQ(got[0].tokens, reference_greedy(m, prompt, 12)) << f;
    EXPECT_EQ(got[0].reason, FinishReason::Length);
    EXPECT_EQ(got[0].prompt_tokens, 7);
  }
}

// Prompts of different lengths, greedy and sampled: all at once in one batch; through 2 slots, so
// that requests join while others decode, with prompts prefilled in chunks of at most 5 tokens;
// and each alone. Same tokens every way.
TEST(InferenceEngine, BatchedAndContinuousEqualOneAtATime) {
  for (const std::string& f : families()) {
    model::GPTModel m(family_config(f));
    const int64_t V = m.config().orig_vocab_size;
    std::vector<Request> reqs;
    for (int i = 0; i < 5; ++i) {
      Request r = greedy(make_prompt(3 + 4 * i, 10 + static_cast<uint32_t>(i), V), 6 + i);
      if (i % 2 == 1) r.sampling = {0.9f, i == 3 ? 5 : 0, i == 3 ? 1.f : 0.8f, 77u + static_cast<uint64_t>(i)};
      reqs.push_back(r);
    }
    std::vector<Completion> alone;
    for (const Request& r : reqs) alone.push_back(run_engine(m, {r}, {})[0]);
    EngineOptions all;
    all.max_batch = 5;
    EngineOptions continuous;
    continuous.max_batch = 2;
    continuous.max_step_tokens = 5;
    const auto batched = run_engine(m, reqs, all), cont = run_engine(m, reqs, continuous);
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(batched[i].tokens, alone[i].tokens) << f << " request " << i;
      EXPECT_EQ(cont[i].tokens, alone[i].tokens) << f << " request " << i;
      EXPECT_EQ(static_cast<int64_t>(alone[i].tokens.size()), reqs[i].max_new_tokens);
    }
    if (f == "llama") {
      EXPECT_EQ(alone[0].tokens, reference_greedy(m, reqs[0].prompt, 6));
    }
  }
}

// A request submitted while another is decoding joins the next step.
TEST(InferenceEngine, RequestsJoinARunningBatch) {
  model::GPTModel m(family_config("llama"));
  const int64_t V = m.config().orig_vocab_size;
  const std::vector<int32_t> a = make_prompt(6, 3, V), b = make_prompt(4, 4, V);
  EngineOptions o;
  o.max_batch = 2;
  inference::Engine e(m, o);
  Completion ca, cb;
  Request ra = greedy(a, 10), rb = greedy(b, 5);
  ra.on_done = [&](inference::RequestId, const Completion& c) { ca = c; };
  rb.on_done = [&](inference::RequestId, const Completion& c) { cb = c; };
  std::vector<int32_t> streamed;
  ra.on_token = [&](inference::RequestId, int32_t t, float) { streamed.push_back(t); };
  e.submit(std::move(ra));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e.step());
  EXPECT_EQ(streamed.size(), 4u);
  e.submit(std::move(rb));
  e.run_until_idle();
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(ca.tokens, reference_greedy(m, a, 10));
  EXPECT_EQ(cb.tokens, reference_greedy(m, b, 5));
  EXPECT_EQ(streamed, ca.tokens);
}

TEST(InferenceEngine, SeededSamplingIsReproducible) {
  model::GPTModel m(family_config("llama"));
  Request r = greedy(make_prompt(5, 5, m.config().orig_vocab_size), 16);
  r.sampling = {1.5f, 0, 1.f, 42};
  const auto x = run_engine(m, {r, r}, {});
  EXPECT_EQ(x[0].tokens, x[1].tokens);
  EXPECT_EQ(run_engine(m, {r}, {})[0].tokens, x[0].tokens);
  r.sampling.seed = 43;
  EXPECT_NE(run_engine(m, {r}, {})[0].tokens, x[0].tokens);
}

TEST(InferenceEngine, StopsOnTokensStringsAndLength) {
  model::GPTModel m(family_config("llama"));
  const std::vector<int32_t> p = make_prompt(5, 6, m.config().orig_vocab_size);
  const std::vector<int32_t> want = reference_greedy(m, p, 10);
  Request r = greedy(p, 10);
  r.stop_tokens = {want[3]};
  const size_t first = static_cast<size_t>(std::find(want.begin(), want.end(), want[3]) - want.begin());
  Completion c = run_engine(m, {r}, {})[0];
  EXPECT_EQ(c.reason, FinishReason::StopToken);
  EXPECT_EQ(c.tokens, std::vector<int32_t>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(first) + 1));
  // Stop strings over a decoder that spells each id as "<id>".
  EngineOptions o;
  o.decode = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) {  // appended piece by piece: GCC 12's -Wrestrict misfires on "<" + s + ">"
      s += '<';
      s += std::to_string(t);
      s += '>';
    }
    return s;
  };
  Request rs = greedy(p, 10);
  rs.stop_strings = {"<" + std::to_string(want[2]) + ">"};
  c = run_engine(m, {rs}, o)[0];
  EXPECT_EQ(c.reason, FinishReason::StopString);
  EXPECT_EQ(c.stop_string, rs.stop_strings[0]);
  EXPECT_LE(c.tokens.size(), 3u);
  c = run_engine(m, {greedy(p, 0)}, {})[0];
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(c.reason, FinishReason::Length);
}

// log softmax over the real vocabulary of row `t` of full-forward logits, at `id` (double sums).
double full_logprob(const Tensor& logits, int64_t t, int64_t V, int64_t Vp, int32_t id) {
  const float* row = logits.data<float>() + t * Vp;
  const double mx = *std::max_element(row, row + V);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
  return row[id] - mx - std::log(sum);
}

// Logprobs (serve's "logprobs": true): each generated token's and each prompt token's after the
// first equal the log-softmax of a full forward over the sequence, greedy and sampled, with the
// prompt prefilled whole or in chunks beside other requests, and a prompt only scored
// (max_new_tokens 0). Requests without logprobs get none.
TEST(InferenceEngine, LogprobsEqualLogSoftmaxOfFullForward) {
  for (const std::string& f : {std::string("llama"), std::string("moe")}) {
    model::GPTModel m(family_config(f));
    const int64_t V = m.config().orig_vocab_size, Vp = m.config().vocab_size;
    Request a = greedy(make_prompt(9, 21, V), 6), b = greedy(make_prompt(4, 22, V), 5), c = greedy(make_prompt(7, 23, V), 0);
    a.logprobs = c.logprobs = true;
    Request s = a;
    s.sampling = {1.2f, 0, 1.f, 5};
    EngineOptions chunked;
    chunked.max_batch = 2;
    chunked.max_step_tokens = 4;  // a's prompt in three chunks, beside b's decoding
    std::vector<float> streamed;
    a.on_token = [&](inference::RequestId, int32_t, float l) { streamed.push_back(l); };
    for (const EngineOptions& o : {EngineOptions{}, chunked}) {
      streamed.clear();
      const auto got = run_engine(m, {a, b, s, c}, o);
      for (size_t i : {0u, 2u, 3u}) {
        const Completion& x = got[i];
        const std::vector<int32_t>& prompt = i == 0 ? a.prompt : i == 2 ? s.prompt : c.prompt;
        std::vector<int32_t> ids = prompt;
        ids.insert(ids.end(), x.tokens.begin(), x.tokens.end());
        const Tensor full = m.logits(ids, 1, static_cast<int64_t>(ids.size()));
        ASSERT_EQ(x.prompt_logprobs.size(), prompt.size() - 1) << f << " request " << i;
        ASSERT_EQ(x.logprobs.size(), x.tokens.size()) << f << " request " << i;
        for (size_t t = 0; t + 1 < ids.size(); ++t) {
          const float got_lp = t + 1 < prompt.size() ? x.prompt_logprobs[t] : x.logprobs[t + 1 - prompt.size()];
          EXPECT_NEAR(got_lp, full_logprob(full, static_cast<int64_t>(t), V, Vp, ids[t + 1]), 1e-4)
              << f << " request " << i << " row " << t;
        }
      }
      EXPECT_EQ(got[3].reason, FinishReason::Length);
      EXPECT_TRUE(got[3].tokens.empty());
      EXPECT_TRUE(got[1].logprobs.empty() && got[1].prompt_logprobs.empty());
      EXPECT_EQ(got[1].tokens, reference_greedy(m, b.prompt, 5)) << f;
      EXPECT_EQ(streamed, got[0].logprobs) << f;
    }
  }
}

// A serving loop on its own thread, fed from this one: it sleeps while idle and wakes to serve.
TEST(InferenceEngine, ServingLoopOnAnotherThread) {
  model::GPTModel m(family_config("llama"));
  inference::Engine e(m, {});
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    while (!stop)
      if (e.wait_for_work(std::chrono::milliseconds(20))) e.step();
  });
  const std::vector<int32_t> p = make_prompt(5, 9, m.config().orig_vocab_size);
  std::promise<Completion> done;
  Request r = greedy(p, 6);
  r.on_done = [&](inference::RequestId, const Completion& c) { done.set_value(c); };
  e.submit(std::move(r));
  std::future<Completion> f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  stop = true;
  loop.join();
  EXPECT_EQ(f.get().tokens, reference_greedy(m, p, 6));
}

TEST(InferenceEngine, CancelFinishesARequest) {
  model::GPTModel m(family_config("llama"));
  inference::Engine e(m, {});
  Completion c;
  Request r = greedy(make_prompt(5, 7, m.config().orig_vocab_size), 20);
  r.on_done = [&](inference::RequestId, const Completion& x) { c = x; };
  const inference::RequestId id = e.submit(std::move(r));
  e.step();
  e.step();
  e.cancel(id);
  e.run_until_idle();
  EXPECT_EQ(c.reason, FinishReason::Cancelled);
  EXPECT_EQ(c.tokens.size(), 2u);
}

TEST(InferenceEngine, RefusesRequestsItCannotServe) {
  model::GPTModel m(family_config("llama"));
  EngineOptions o;
  o.max_seq_len = 16;
  inference::Engine e(m, o);
  EXPECT_EQ(error_of([&] { e.submit(greedy({}, 1)); }), "the prompt is empty: give at least one token");
  EXPECT_EQ(error_of([&] { e.submit(greedy({1, 60}, 1)); }), "prompt token 60 (at 1) is outside the vocabulary of 60");
  EXPECT_EQ(error_of([&] { e.submit(greedy(std::vector<int32_t>(17, 1), 0)); }),
            "the prompt is 17 tokens but the context is 16: shorten the prompt");
  EXPECT_EQ(error_of([&] { e.submit(greedy({1, 2}, 15)); }),
            "prompt (2 tokens) + max new tokens (15) exceeds the context of 16 tokens: ask for 14 or fewer");
  Request r = greedy({1}, 1);
  r.sampling.top_p = 0.f;
  EXPECT_EQ(error_of([&] { e.submit(r); }), "top-p must be in (0, 1] (got 0); 1 keeps every token");
  r = greedy({1}, 1);
  r.stop_strings = {"x"};
  EXPECT_EQ(error_of([&] { e.submit(r); }), "stop strings need a tokenizer to decode with; this engine has none");
  EXPECT_TRUE(e.idle());
}

}  // namespace
}  // namespace mt::test
