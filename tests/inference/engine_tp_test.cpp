// The generation engine under tensor parallelism (#22: TP > 1 with megatron launch), on CPU
// processes over Gloo: each rank runs its heads, ffn and vocabulary shards and caches its own
// key/value groups; the gathered logits give every rank the same tokens. Greedy and seeded tokens
// equal the single-rank engine's, and the logits of a step agree to fp32 rounding (the row-parallel
// GEMMs sum in another order). Weights are cut from the same full initialisation as TP = 1.
// The ranks are forked: run these through ctest (a process per test) or alone
// (--gtest_filter=InferenceTp.*), since a child forked after the parent's OpenMP threads ran
// (the other tests of this binary) cannot start its own.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/multiprocess.h"
#include "core/error.h"
#include "inference/engine_support.h"
#include "inference/model_runner.h"
#include "parallel/layout_support.h"

namespace mt::test {
namespace {

// Three prompts of different lengths, greedy and seeded sampling, run together (continuous
// batching with prompt chunks of 8 tokens, so prefill and decode rows share passes).
std::vector<inference::Completion> generate_all(model::GPTModel& m) {
  const int64_t V = m.config().orig_vocab_size;
  std::vector<inference::Request> reqs;
  for (int i = 0; i < 3; ++i) {
    inference::Request r;
    r.prompt = make_prompt(5 + 7 * i, 100 + static_cast<uint32_t>(i), V);
    r.max_new_tokens = 8;
    if (i == 2) r.sampling = {0.8f, 10, 0.9f, 77};
    reqs.push_back(r);
  }
  inference::EngineOptions o;
  o.max_batch = 2;  // the third request joins when a slot frees
  o.max_step_tokens = 8;
  return run_engine(m, reqs, o);
}

// One step's logits through the runner: a two-slot prefill of 6 and 4 tokens.
Tensor step_logits(model::GPTModel& m) {
  inference::ModelRunner run(m, 2, 16);
  inference::StepBatch b;
  for (int s = 0; s < 2; ++s)
    for (int p = 0; p < 6 - 2 * s; ++p) {
      b.tokens.push_back((7 * p + 3 * s + 1) % 60);
      b.slots.push_back(s);
      b.positions.push_back(p);
    }
  b.logit_rows = {5, 9};
  return run.forward(b);
}

void check_family(const std::string& family) {
  const model::TransformerConfig c = family_config(family);
  // Everything runs in the ranks' processes, the single-rank reference too: the parent computes
  // nothing (an OpenMP pool made before a fork does not work in the child).
  auto res = testing::run_ranks(2, [&](comm::World& w) {
    model::GPTModel one(c);
    const std::vector<inference::Completion> want = generate_all(one);
    const Tensor want_logits = step_logits(one);
    model::ModelOptions o;
    o.tp = w.world().get();
    model::GPTModel m(c, o);
    const std::vector<inference::Completion> got = generate_all(m);
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i].tokens != want[i].tokens)
        throw Error(fmt::format("{} rank {}: request {} gave other tokens than one rank", family, w.rank(), i));
    const Tensor l = step_logits(m);
    double worst = 0, scale = 0;
    for (int64_t k = 0; k < l.numel(); ++k) {
      worst = std::max(worst, std::fabs(static_cast<double>(l.data<float>()[k]) - want_logits.data<float>()[k]));
      scale = std::max(scale, std::fabs(static_cast<double>(want_logits.data<float>()[k])));
    }
    if (!(worst <= 1e-5 * scale))
      throw Error(fmt::format("{} rank {}: logits differ by {} (largest {})", family, w.rank(), worst, scale));
  });
  ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, 2)) << family;
}

TEST(InferenceTp, TP2TokensAndLogitsEqualOneRankLlama) { check_family("llama"); }
TEST(InferenceTp, TP2TokensAndLogitsEqualOneRankGpt2) { check_family("gpt2"); }
TEST(InferenceTp, TP2TokensAndLogitsEqualOneRankQwen3) { check_family("qwen3"); }

TEST(InferenceTp, RefusesSequenceParallelAndSplitGroups) {
  auto res = testing::run_ranks(2, [&](comm::World& w) {
    model::TransformerConfig c = family_config("llama");
    model::ModelOptions o;
    o.tp = w.world().get();
    o.sequence_parallel = true;
    model::GPTModel m(c, o);
    try {
      inference::ModelRunner run(m, 1, 8);
    } catch (const Error& e) {
      if (std::string(e.what()).find("--sequence-parallel") != std::string::npos) return;
      throw;
    }
    throw Error("a sequence-parallel model was accepted");
  });
  ASSERT_NO_FATAL_FAILURE(testing::expect_ranks_ok(res, 2));
}

}  // namespace
}  // namespace mt::test
