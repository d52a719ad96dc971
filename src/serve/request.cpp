#include "serve/request.h"

#include <cmath>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace mt::serve {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxDepth = 16;        // the deepest valid body is 3 levels ([[ids]] in an object)
constexpr size_t kMaxStops = 16;        // stop strings per request
constexpr size_t kMaxStopBytes = 1024;  // bytes per stop string

[[noreturn]] void bad(const std::string& msg) { throw RequestError(400, msg); }

// Refuses nesting deeper than any valid request before parsing, so that no body can make the
// parser or the value's destructor recurse deeply.
void check_depth(std::string_view body) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) bad(fmt::format("the JSON body nests deeper than {} levels", kMaxDepth));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

json parse_object(std::string_view body) {
  check_depth(body);
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) bad("the body is not valid JSON");
  if (!j.is_object()) bad(fmt::format("the body must be a JSON object, not {}", j.type_name()));
  return j;
}

void refuse_unknown(const json& j, const std::set<std::string>& known, const char* endpoint) {
  for (const auto& [k, v] : j.items())
    if (!known.count(k)) bad(fmt::format("unknown field \"{}\" for {}", k.substr(0, 64), endpoint));
}

int64_t get_int(const json& v, const char* name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(fmt::format("\"{}\" must be an integer, not {}", name, v.type_name()));
  // Non-negative literals parse as unsigned, negative ones as signed (hi >= 0 in every use).
  const bool out = v.is_number_unsigned()
                       ? v.get<uint64_t>() > static_cast<uint64_t>(hi) || (lo > 0 && v.get<uint64_t>() < static_cast<uint64_t>(lo))
                       : v.get<int64_t>() < lo || v.get<int64_t>() > hi;
  if (out)
    bad(fmt::format("\"{}\" must be in [{}, {}] (got {})", name, lo, hi, v.dump()));
  return v.get<int64_t>();
}

double get_number(const json& v, const char* name) {
  if (!v.is_number()) bad(fmt::format("\"{}\" must be a number, not {}", name, v.type_name()));
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(fmt::format("\"{}\" must be finite", name));
  return d;
}

bool get_bool(const json& v, const char* name) {
  if (!v.is_boolean()) bad(fmt::format("\"{}\" must be true or false, not {}", name, v.type_name()));
  return v.get<bool>();
}

uint64_t get_seed(const json& v, const char* name) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
    bad(fmt::format("\"{}\" must be a non-negative integer", name));
  return v.get<uint64_t>();
}

std::vector<int32_t> get_ids(const json& v, const char* name, const Limits& l) {
  std::vector<int32_t> ids;
  for (const json& t : v) {
    if (!t.is_number_integer()) bad(fmt::format("\"{}\" holds a token id that is not an integer", name));
    if (static_cast<int64_t>(ids.size()) >= l.max_prompt_tokens)
      throw RequestError(400, fmt::format("\"{}\" has more than {} tokens (the server's --max-prompt-tokens)", name,
                                          l.max_prompt_tokens));
    ids.push_back(static_cast<int32_t>(get_int(t, "prompt token id", 0, l.vocab - 1)));
  }
  if (ids.empty()) bad(fmt::format("\"{}\" holds an empty list of token ids", name));
  return ids;
}

void check_prompt_count(size_t n, const char* name, const Limits& l) {
  if (n == 0) bad(fmt::format("\"{}\" is empty", name));
  if (static_cast<int64_t>(n) > l.max_prompts) bad(fmt::format("\"{}\" has {} prompts; at most {}", name, n, l.max_prompts));
}

void add_stop(ParsedRequest& r, const json& s, const char* name) {
  if (!s.is_string()) bad(fmt::format("\"{}\" must be a string or a list of strings", name));
  const std::string& v = s.get_ref<const std::string&>();
  if (v.empty()) bad(fmt::format("\"{}\" holds an empty stop string", name));
  if (v.size() > kMaxStopBytes) bad(fmt::format("\"{}\" holds a stop string over {} bytes", name, kMaxStopBytes));
  if (r.stop.size() >= kMaxStops) bad(fmt::format("\"{}\" has more than {} stop strings", name, kMaxStops));
  r.stop.push_back(v);
}

int64_t get_max_tokens(const json& v, const char* name, const Limits& l) {
  if (!v.is_number_integer()) bad(fmt::format("\"{}\" must be an integer, not {}", name, v.type_name()));
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) bad(fmt::format("\"{}\" must be >= 0", name));
  if (v.get<uint64_t>() > static_cast<uint64_t>(l.max_tokens))
    bad(fmt::format("\"{}\" is {}; this server generates at most {} tokens per prompt (--max-tokens-to-generate)", name,
                    v.dump(), l.max_tokens));
  return v.get<int64_t>();
}

}  // namespace

// Megatron's text generation server: the fields of its PUT /api, with its defaults and rules
// (temperature in (0, 100], greedy as top_k 1, not both top_k and top_p, empty prompts only with
// add_BOS). Its retired fields get its own messages.
ParsedRequest parse_megatron_request(std::string_view body, const Limits& l) {
  const json j = parse_object(body);
  if (j.contains("max_len")) bad("max_len is no longer used; replace it with tokens_to_generate");
  if (j.contains("sentences")) bad("sentences is no longer used; replace it with prompts");
  if (j.contains("beam_width")) bad("beam search is not supported (beam_width)");
  refuse_unknown(j,
                 {"prompts", "tokens_to_generate", "logprobs", "temperature", "top_k", "top_p", "top_p_decay",
                  "top_p_bound", "add_BOS", "stop_on_double_eol", "stop_on_eol", "prevent_newline_after_colon",
                  "random_seed", "stop_token", "length_penalty", "no_log"},
                 "PUT /api");
  ParsedRequest r;
  r.api = Api::Megatron;
  if (!j.contains("prompts")) bad("\"prompts\" is required: a list of strings");
  const json& ps = j["prompts"];
  if (!ps.is_array()) bad("\"prompts\" must be a list of strings");
  check_prompt_count(ps.size(), "prompts", l);
  for (const json& p : ps) {
    if (!p.is_string()) bad("\"prompts\" must be a list of strings");
    r.prompts.push_back(Prompt{p.get<std::string>(), {}, false});
  }
  r.max_tokens_given = j.contains("tokens_to_generate");
  r.max_tokens = r.max_tokens_given ? get_max_tokens(j["tokens_to_generate"], "tokens_to_generate", l)
                                    : std::min<int64_t>(64, l.max_tokens);  // Megatron's default
  if (j.contains("logprobs")) r.logprobs = get_bool(j["logprobs"], "logprobs");
  if (r.max_tokens == 0 && !r.logprobs) bad("tokens_to_generate 0 needs logprobs true (it only scores the prompts)");
  if (j.contains("temperature")) {
    const double t = get_number(j["temperature"], "temperature");
    if (!(t > 0 && t <= 100)) bad("\"temperature\" must be in (0, 100]; for greedy, set top_k 1");
    r.temperature = static_cast<float>(t);
  }
  if (j.contains("top_k")) r.top_k = get_int(j["top_k"], "top_k", 0, 1000);
  if (j.contains("top_p")) {
    const double p = get_number(j["top_p"], "top_p");
    if (!(p >= 0 && p <= 1)) bad("\"top_p\" must be in [0, 1] (0 = off)");
    if (p > 0 && r.top_k > 0) bad("cannot set both top_k and top_p");
    r.top_p = p > 0 ? static_cast<float>(p) : 1.f;
  }
  for (const char* f : {"top_p_decay", "top_p_bound"})
    if (j.contains(f) && get_number(j[f], f) != 0) bad(fmt::format("\"{}\" is not supported (leave it 0)", f));
  if (j.contains("add_BOS")) r.add_bos = get_bool(j["add_BOS"], "add_BOS");
  if (!r.add_bos)
    for (const Prompt& p : r.prompts)
      if (p.text.empty()) bad("an empty prompt needs add_BOS true");
  if (j.contains("stop_on_double_eol") && get_bool(j["stop_on_double_eol"], "stop_on_double_eol")) r.stop.push_back("\n\n");
  if (j.contains("stop_on_eol") && get_bool(j["stop_on_eol"], "stop_on_eol")) r.stop.push_back("\n");
  if (j.contains("prevent_newline_after_colon") && get_bool(j["prevent_newline_after_colon"], "prevent_newline_after_colon"))
    bad("\"prevent_newline_after_colon\" is not supported");
  if (j.contains("random_seed")) r.seed = get_seed(j["random_seed"], "random_seed");
  if (j.contains("stop_token")) r.stop_token = get_int(j["stop_token"], "stop_token", 0, l.vocab - 1);
  if (j.contains("length_penalty")) (void)get_number(j["length_penalty"], "length_penalty");  // beam search only
  if (j.contains("no_log")) (void)get_bool(j["no_log"], "no_log");
  return r;
}

// OpenAI's completions: prompt as text, texts, token ids or lists of token ids; temperature 0
// is greedy; one completion per prompt.
ParsedRequest parse_openai_request(std::string_view body, const Limits& l) {
  const json j = parse_object(body);
  refuse_unknown(j,
                 {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "best_of", "stream",
                  "stream_options", "stop", "seed", "echo", "logprobs", "presence_penalty", "frequency_penalty",
                  "logit_bias", "user", "suffix"},
                 "POST /v1/completions");
  ParsedRequest r;
  r.api = Api::OpenAI;
  if (j.contains("model") && !j["model"].is_string()) bad("\"model\" must be a string");
  if (j.contains("user") && !j["user"].is_string()) bad("\"user\" must be a string");
  if (!j.contains("prompt")) bad("\"prompt\" is required: a string, a list of strings, or token ids");
  const json& p = j["prompt"];
  if (p.is_string()) {
    r.prompts.push_back(Prompt{p.get<std::string>(), {}, false});
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompts.push_back(Prompt{"", get_ids(p, "prompt", l), true});
  } else if (p.is_array()) {
    check_prompt_count(p.size(), "prompt", l);
    for (const json& e : p) {
      if (e.is_string()) r.prompts.push_back(Prompt{e.get<std::string>(), {}, false});
      else if (e.is_array()) r.prompts.push_back(Prompt{"", get_ids(e, "prompt", l), true});
      else bad("\"prompt\" must be a string, a list of strings, a list of token ids or a list of those");
    }
  } else {
    bad("\"prompt\" must be a string, a list of strings, a list of token ids or a list of those");
  }
  r.max_tokens_given = j.contains("max_tokens") && !j["max_tokens"].is_null();
  r.max_tokens = r.max_tokens_given ? get_max_tokens(j["max_tokens"], "max_tokens", l)
                                    : std::min<int64_t>(16, l.max_tokens);  // OpenAI's default
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    const double t = get_number(j["temperature"], "temperature");
    if (!(t >= 0 && t <= 2)) bad("\"temperature\" must be in [0, 2] (0 = greedy)");
    r.temperature = static_cast<float>(t);
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    const double tp = get_number(j["top_p"], "top_p");
    if (!(tp > 0 && tp <= 1)) bad("\"top_p\" must be in (0, 1] (1 = all tokens)");
    r.top_p = static_cast<float>(tp);
  }
  if (j.contains("top_k") && !j["top_k"].is_null()) r.top_k = get_int(j["top_k"], "top_k", 0, l.vocab);
  for (const char* f : {"n", "best_of"})  // one completion per prompt
    if (j.contains(f) && !j[f].is_null() && !(j[f].is_number_integer() && j[f].get<int64_t>() == 1))
      bad(fmt::format("\"{}\" must be 1: this server returns one completion per prompt", f));
  if (j.contains("stream") && !j["stream"].is_null()) r.stream = get_bool(j["stream"], "stream");
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const json& o = j["stream_options"];
    if (!o.is_object()) bad("\"stream_options\" must be an object");
    for (const auto& [k, v] : o.items()) {
      if (k != "include_usage") bad(fmt::format("unknown field \"stream_options.{}\"", k.substr(0, 64)));
      r.include_usage = get_bool(v, "stream_options.include_usage");
    }
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_array())
      for (const json& e : s) add_stop(r, e, "stop");
    else
      add_stop(r, s, "stop");
  }
  if (j.contains("seed") && !j["seed"].is_null()) r.seed = get_seed(j["seed"], "seed");
  if (j.contains("echo") && !j["echo"].is_null()) r.echo = get_bool(j["echo"], "echo");
  if (j.contains("logprobs") && !j["logprobs"].is_null())
    bad("\"logprobs\" is not supported here; PUT /api with \"logprobs\": true returns them");
  for (const char* f : {"presence_penalty", "frequency_penalty"})
    if (j.contains(f) && !j[f].is_null() && get_number(j[f], f) != 0) bad(fmt::format("\"{}\" is not supported (leave it 0)", f));
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() && !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
    bad("\"logit_bias\" is not supported");
  if (j.contains("suffix") && !j["suffix"].is_null()) bad("\"suffix\" is not supported");
  if (r.stream && r.prompts.size() > 1) bad("\"stream\" takes one prompt per request");
  return r;
}

int64_t check_token_limits(int64_t prompt_tokens, const ParsedRequest& r, const Limits& l) {
  const char* gen = r.api == Api::Megatron ? "tokens_to_generate" : "max_tokens";
  if (prompt_tokens > l.max_prompt_tokens)
    bad(fmt::format("the prompt is {} tokens; this server takes at most {} (--max-prompt-tokens)", prompt_tokens,
                    l.max_prompt_tokens));
  const int64_t room = l.context - prompt_tokens;
  if (room < 0)
    bad(fmt::format("the prompt is {} tokens but the model's context is {}: shorten it", prompt_tokens, l.context));
  if (!r.max_tokens_given) return std::min(r.max_tokens, room);
  if (r.max_tokens > room)
    bad(fmt::format("the prompt ({} tokens) + {} ({}) exceed the model's context of {} tokens: ask for {} or fewer",
                    prompt_tokens, gen, r.max_tokens, l.context, room));
  return r.max_tokens;
}

}  // namespace mt::serve
