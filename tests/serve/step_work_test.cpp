// What rank 0 of a tensor-parallel server broadcasts before each engine step (step_work.h): the
// message carries everything the engine computes with, bit for bit (float sampling values, seeds
// past 2^63, stop tokens, logprobs), and a malformed one is refused rather than read past its
// end; applying it submits in order (so every rank's engine gives the same ids) and refuses, on
// every rank alike, what the engine cannot serve.
#include "serve/step_work.h"

#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "support/error_of.h"
#include "support/tiny_models.h"

namespace mt::serve {
namespace {

inference::Request request(std::vector<int32_t> prompt, int64_t n) {
  inference::Request r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  return r;
}

TEST(StepWork, RoundTripsEverythingTheEngineComputesWith) {
  StepWork w;
  w.fresh.push_back(request({1, 2, 3}, 5));
  inference::Request b = request({7}, 0);
  b.sampling = {0.7f, 20, 0.95f, 0xFEDCBA9876543210ULL};
  b.stop_tokens = {0, 9};
  b.logprobs = true;
  w.fresh.push_back(b);
  w.cancel = {4, 11};
  const StepWork got = decode_work(encode_work(w));
  ASSERT_EQ(got.fresh.size(), 2u);
  EXPECT_EQ(got.fresh[0].prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(got.fresh[0].max_new_tokens, 5);
  EXPECT_FALSE(got.fresh[0].logprobs);
  const inference::Request& g = got.fresh[1];
  EXPECT_EQ(g.prompt, std::vector<int32_t>{7});
  EXPECT_EQ(g.max_new_tokens, 0);
  EXPECT_EQ(g.sampling.temperature, 0.7f);
  EXPECT_EQ(g.sampling.top_k, 20);
  EXPECT_EQ(g.sampling.top_p, 0.95f);
  EXPECT_EQ(g.sampling.seed, 0xFEDCBA9876543210ULL);
  EXPECT_EQ(g.stop_tokens, (std::vector<int32_t>{0, 9}));
  EXPECT_TRUE(g.logprobs);
  EXPECT_EQ(got.cancel, (std::vector<inference::RequestId>{4, 11}));
  EXPECT_FALSE(got.shutdown);
  StepWork stop;
  stop.shutdown = true;
  EXPECT_TRUE(decode_work(encode_work(stop)).shutdown);
}

TEST(StepWork, RefusesAMalformedMessage) {
  StepWork w;
  w.fresh.push_back(request({1, 2, 3}, 5));
  std::vector<int64_t> words = encode_work(w);
  std::vector<int64_t> cut(words.begin(), words.end() - 1);
  EXPECT_NE(test::error_of([&] { decode_work(cut); }).find("ends early"), std::string::npos);
  std::vector<int64_t> extra = words;
  extra.push_back(0);
  EXPECT_NE(test::error_of([&] { decode_work(extra); }).find("past its end"), std::string::npos);
  std::vector<int64_t> huge = words;
  huge[2] = int64_t{1} << 40;  // the prompt's length
  EXPECT_NE(test::error_of([&] { decode_work(huge); }).find("holds a count of"), std::string::npos);
}

TEST(StepWork, ApplySubmitsInOrderAndRefusesAlike) {
  model::GPTModel m(test::tiny_llama_config(1));
  inference::Engine e(m, {});
  const int32_t V = static_cast<int32_t>(e.vocab_size());
  StepWork w;
  w.fresh = {request({1, 2}, 2), request({1, V}, 2), request({3}, 1)};
  std::vector<std::string> errors;
  const std::vector<inference::RequestId> ids = apply_work(e, w, &errors);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_GT(ids[0], 0);
  EXPECT_EQ(ids[1], 0);  // a token outside the vocabulary
  EXPECT_NE(errors[1].find("outside the vocabulary"), std::string::npos);
  EXPECT_EQ(ids[2], ids[0] + 1);
  EXPECT_EQ(errors[0], "");
  StepWork c;
  c.cancel = {ids[0]};
  apply_work(e, c, nullptr);
  e.run_until_idle();
  EXPECT_TRUE(e.idle());
}

}  // namespace
}  // namespace mt::serve
