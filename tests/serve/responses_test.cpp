// The answers' shapes: Megatron's {"text", "tokens", "segments", "logprobs"}, OpenAI's completion
// and its server-sent events, and that invalid UTF-8 in generated text never fails to encode.
#include "serve/responses.h"

#include <gtest/gtest.h>

#include <cmath>

#include "serve/cpu_backend.h"

namespace mt::serve {
namespace {

using json = nlohmann::json;

std::unique_ptr<data::Tokenizer> null_tokenizer() {
  data::TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = 1000;
  return data::build_tokenizer(o);
}

TEST(ServeResponses, Megatron) {
  auto tok = null_tokenizer();
  ParsedRequest r;
  r.api = Api::Megatron;
  r.logprobs = true;
  PreparedPrompt p{"1 2", {1, 2}, false, 4};
  Completion c;
  c.tokens = {3, 4};
  c.text = " 3 4";
  c.logprobs = {-1.f, -2.f};
  c.prompt_logprobs = {-0.5f};
  const json j = megatron_response(r, {p}, {c}, *tok);
  EXPECT_EQ(j["text"][0], "1 2 3 4");
  EXPECT_EQ(j["tokens"][0], json({1, 2, 3, 4}));
  EXPECT_EQ(j["segments"][0], json({"1", "2", "3", "4"}));
  EXPECT_EQ(j["logprobs"][0], json({-0.5f, -1.f, -2.f}));
  r.logprobs = false;
  EXPECT_FALSE(megatron_response(r, {p}, {c}, *tok).contains("logprobs"));
}

TEST(ServeResponses, OpenAI) {
  ParsedRequest r;
  r.echo = true;
  PreparedPrompt p{"1 2", {1, 2}, false, 4};
  Completion c;
  c.tokens = {3};
  c.text = " 3";
  c.finish = Finish::StopToken;
  const CompletionMeta m{"cmpl-1", 7, "tiny"};
  const json j = openai_response(m, r, {p}, {c});
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["text"], "1 2 3");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"], json({{"prompt_tokens", 2}, {"completion_tokens", 1}, {"total_tokens", 3}}));
  const std::string e = openai_chunk_event(m, " 3", "");
  ASSERT_EQ(e.rfind("data: ", 0), 0u);
  ASSERT_EQ(e.substr(e.size() - 2), "\n\n");
  const json chunk = json::parse(e.substr(6));
  EXPECT_EQ(chunk["choices"][0]["text"], " 3");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(json::parse(openai_usage_event(m, 2, 1).substr(6))["usage"]["total_tokens"], 3);
}

TEST(ServeResponses, InvalidUtf8IsReplacedNotThrown) {
  const std::string s = dump_json(json{{"text", std::string("a\xC3")}});
  EXPECT_NE(s.find("a\xEF\xBF\xBD"), std::string::npos) << s;  // U+FFFD
  EXPECT_NE(error_body(400, "bad \xFF").find("\"code\":400"), std::string::npos);
}

TEST(ServeCpuBackend, LogProb) {
  EXPECT_NEAR(log_prob({0.f, 0.f, 0.f, 0.f}, 2), -std::log(4.0), 1e-6);
  EXPECT_NEAR(log_prob({1000.f, 0.f}, 0), 0.0, 1e-6);  // no overflow at large logits
  EXPECT_LT(log_prob({1000.f, 0.f}, 1), -999.f);
}

}  // namespace
}  // namespace mt::serve
