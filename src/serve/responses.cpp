#include "serve/responses.h"

namespace mt::serve {

using json = nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(int status, const std::string& message) {
  const char* type = status == 503 || status == 504 ? "server_error" : "invalid_request_error";
  return dump_json({{"error", {{"message", message}, {"type", type}, {"code", status}}}});
}

json megatron_response(const ParsedRequest& r, const std::vector<PreparedPrompt>& prompts,
                       const std::vector<Completion>& done, const data::Tokenizer& tok) {
  json text = json::array(), tokens = json::array(), segments = json::array(), logprobs = json::array();
  for (size_t i = 0; i < done.size(); ++i) {
    const PreparedPrompt& p = prompts[i];
    const Completion& c = done[i];
    // The prompt as sent, not re-decoded: tokenization artifacts stay out (as Megatron does).
    text.push_back(p.text + c.text);
    std::vector<int32_t> all = p.ids;
    all.insert(all.end(), c.tokens.begin(), c.tokens.end());
    json seg = json::array();
    for (int32_t id : all) seg.push_back(tok.decode({id}));
    tokens.push_back(all);
    segments.push_back(std::move(seg));
    std::vector<float> lp = c.prompt_logprobs;
    lp.insert(lp.end(), c.logprobs.begin(), c.logprobs.end());
    logprobs.push_back(lp);
  }
  json out = {{"text", text}, {"tokens", tokens}, {"segments", segments}};
  if (r.logprobs) out["logprobs"] = logprobs;
  return out;
}

json openai_response(const CompletionMeta& m, const ParsedRequest& r, const std::vector<PreparedPrompt>& prompts,
                     const std::vector<Completion>& done) {
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const std::string text = (r.echo ? prompts[i].text : "") + done[i].text;
    choices.push_back({{"text", text}, {"index", i}, {"finish_reason", finish_reason(done[i])}, {"logprobs", nullptr}});
    prompt_tokens += static_cast<int64_t>(prompts[i].ids.size());
    completion_tokens += static_cast<int64_t>(done[i].tokens.size());
  }
  return {{"id", m.id},
          {"object", "text_completion"},
          {"created", m.created},
          {"model", m.model},
          {"choices", choices},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
}

namespace {
json chunk_base(const CompletionMeta& m) {
  return {{"id", m.id}, {"object", "text_completion"}, {"created", m.created}, {"model", m.model}};
}
std::string event(const json& j) { return "data: " + dump_json(j) + "\n\n"; }
}  // namespace

std::string openai_chunk_event(const CompletionMeta& m, const std::string& text, const std::string& finish_reason) {
  json j = chunk_base(m);
  j["choices"] = json::array({{{"text", text},
                               {"index", 0},
                               {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)},
                               {"logprobs", nullptr}}});
  return event(j);
}

std::string openai_usage_event(const CompletionMeta& m, int64_t prompt_tokens, int64_t completion_tokens) {
  json j = chunk_base(m);
  j["choices"] = json::array();
  j["usage"] = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens}};
  return event(j);
}

}  // namespace mt::serve
