// Parsing and checking of `megatron serve`'s request bodies: every bad field is a RequestError
// with a 4xx status and a message naming the field.
#include "serve/request.h"

#include <gtest/gtest.h>

namespace mt::serve {
namespace {

Limits limits() {
  Limits l;
  l.context = 32;
  l.max_prompt_tokens = 16;
  l.max_tokens = 8;
  l.vocab = 101;
  return l;
}

// The status and message a body is refused with.
template <class Parse>
std::pair<int, std::string> refusal(Parse parse, const std::string& body) {
  try {
    parse(body, limits());
  } catch (const RequestError& e) {
    return {e.status, e.what()};
  }
  return {0, "accepted"};
}

void expect_refused(const std::string& body, const std::string& needle, bool megatron) {
  const auto [status, msg] =
      megatron ? refusal(parse_megatron_request, body) : refusal(parse_openai_request, body);
  EXPECT_EQ(status, 400) << body << ": " << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << body << ": " << msg;
}

TEST(ServeRequest, MegatronDefaultsAndFields) {
  ParsedRequest r = parse_megatron_request(R"({"prompts": ["1 2", "3"]})", limits());
  EXPECT_EQ(r.api, Api::Megatron);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].text, "1 2");
  EXPECT_EQ(r.max_tokens, 8);  // Megatron's 64, capped by the server
  EXPECT_FALSE(r.max_tokens_given);
  EXPECT_EQ(r.temperature, 1.f);
  EXPECT_EQ(r.top_p, 1.f);  // Megatron's top_p 0 = off
  EXPECT_FALSE(r.seed);
  r = parse_megatron_request(
      R"({"prompts": ["1"], "tokens_to_generate": 5, "top_k": 1, "random_seed": 9, "stop_on_eol": true,
          "logprobs": true, "stop_token": 100, "add_BOS": false, "no_log": true})",
      limits());
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_TRUE(r.max_tokens_given);
  EXPECT_EQ(r.top_k, 1);
  EXPECT_EQ(*r.seed, 9u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(*r.stop_token, 100);
}

TEST(ServeRequest, MegatronRefusals) {
  expect_refused("{\"prompts\": [\"1\"]", "not valid JSON", true);
  expect_refused("[]", "must be a JSON object", true);
  expect_refused("{}", "\"prompts\" is required", true);
  expect_refused(R"({"prompts": "1"})", "list of strings", true);
  expect_refused(R"({"prompts": []})", "\"prompts\" is empty", true);
  expect_refused(R"({"prompts": [1]})", "list of strings", true);
  expect_refused(R"({"prompts": [""]})", "add_BOS", true);
  expect_refused(R"({"prompts": ["1"], "max_len": 3})", "tokens_to_generate", true);
  expect_refused(R"({"prompts": ["1"], "beam_width": 3})", "beam", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": "3"})", "must be an integer", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": 3.5})", "must be an integer", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": -1})", "must be >= 0", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": 9})", "--max-tokens-to-generate", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": 18446744073709551615})", "--max-tokens-to-generate", true);
  expect_refused(R"({"prompts": ["1"], "tokens_to_generate": 0})", "logprobs", true);
  expect_refused(R"({"prompts": ["1"], "temperature": 0})", "top_k 1", true);
  expect_refused(R"({"prompts": ["1"], "temperature": 101})", "(0, 100]", true);
  expect_refused(R"({"prompts": ["1"], "temperature": 1e999})", "", true);
  expect_refused(R"({"prompts": ["1"], "top_k": 2, "top_p": 0.5})", "both top_k and top_p", true);
  expect_refused(R"({"prompts": ["1"], "top_k": 1001})", "top_k", true);
  expect_refused(R"({"prompts": ["1"], "random_seed": -1})", "non-negative", true);
  expect_refused(R"({"prompts": ["1"], "stop_token": 101})", "stop_token", true);
  expect_refused(R"({"prompts": ["1"], "logprobs": 1})", "true or false", true);
  expect_refused(R"({"prompts": ["1"], "prompt": "x"})", "unknown field \"prompt\"", true);
  std::string many = R"({"prompts": [)";
  for (int i = 0; i < 129; ++i) many += std::string(i ? "," : "") + "\"1\"";
  expect_refused(many + "]}", "at most 128", true);
}

TEST(ServeRequest, OpenAIPromptForms) {
  ParsedRequest r = parse_openai_request(R"({"prompt": "1 2"})", limits());
  EXPECT_EQ(r.max_tokens, 8);  // OpenAI's 16, capped
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  r = parse_openai_request(R"({"prompt": [5, 6, 100]})", limits());
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{5, 6, 100}));
  r = parse_openai_request(R"({"prompt": ["1", [2, 3]], "max_tokens": 4, "temperature": 0, "stop": "x",
                               "seed": 3, "echo": true, "n": 1, "model": "m", "logprobs": null})",
                           limits());
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_TRUE(r.prompts[1].is_tokens);
  EXPECT_EQ(r.temperature, 0.f);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.echo);
  r = parse_openai_request(R"({"prompt": "1", "stream": true, "stream_options": {"include_usage": true},
                               "stop": ["a", "b"]})",
                           limits());
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.stop.size(), 2u);
}

TEST(ServeRequest, OpenAIRefusals) {
  expect_refused("", "not valid JSON", false);
  expect_refused(R"({"max_tokens": 1})", "\"prompt\" is required", false);
  expect_refused(R"({"prompt": 5})", "\"prompt\" must be", false);
  expect_refused(R"({"prompt": []})", "\"prompt\" is empty", false);
  expect_refused(R"({"prompt": [1, "a"]})", "not an integer", false);
  expect_refused(R"({"prompt": [1, 101]})", "prompt token id", false);
  expect_refused(R"({"prompt": [[]]})", "empty list", false);
  expect_refused(R"({"prompt": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]})", "--max-prompt-tokens", false);
  expect_refused(R"({"prompt": "1", "max_tokens": 9})", "--max-tokens-to-generate", false);
  expect_refused(R"({"prompt": "1", "temperature": 2.5})", "[0, 2]", false);
  expect_refused(R"({"prompt": "1", "top_p": 0})", "(0, 1]", false);
  expect_refused(R"({"prompt": "1", "n": 2})", "\"n\" must be 1", false);
  expect_refused(R"({"prompt": "1", "stream": "yes"})", "true or false", false);
  expect_refused(R"({"prompt": ["1", "2"], "stream": true})", "one prompt", false);
  expect_refused(R"({"prompt": "1", "stop": ""})", "empty stop string", false);
  expect_refused(R"({"prompt": "1", "stop": [1]})", "list of strings", false);
  expect_refused(R"({"prompt": "1", "logprobs": 1})", "PUT /api", false);
  expect_refused(R"({"prompt": "1", "presence_penalty": 0.5})", "not supported", false);
  expect_refused(R"({"prompt": "1", "stream_options": {"x": 1}})", "stream_options.x", false);
  expect_refused(R"({"prompt": "1", "max_new_tokens": 3})", "unknown field \"max_new_tokens\"", false);
  expect_refused(std::string(100, '[') + std::string(100, ']'), "nests deeper", false);
}

TEST(ServeRequest, TokenLimits) {
  Limits l = limits();
  l.max_prompt_tokens = 30;
  ParsedRequest r = parse_openai_request(R"({"prompt": "1"})", l);
  EXPECT_EQ(check_token_limits(10, r, l), 8);  // the default fits
  EXPECT_EQ(check_token_limits(28, r, l), 4);  // shrunk to the context's room
  r = parse_openai_request(R"({"prompt": "1", "max_tokens": 8})", l);
  EXPECT_EQ(check_token_limits(24, r, l), 8);
  try {
    check_token_limits(25, r, l);
    FAIL() << "accepted a prompt + max_tokens beyond the context";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("ask for 7 or fewer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_token_limits(31, r, l), RequestError);  // over --max-prompt-tokens
}

}  // namespace
}  // namespace mt::serve
