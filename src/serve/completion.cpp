#include "serve/completion.h"

#include <fmt/format.h>

#include "core/error.h"
#include "serve/text_stream.h"

namespace mt::serve {

std::vector<PreparedPrompt> prepare(const ParsedRequest& r, const Backend& b, const Limits& l) {
  const data::Tokenizer& tok = b.tokenizer();
  std::vector<PreparedPrompt> out;
  for (const Prompt& p : r.prompts) {
    PreparedPrompt pp;
    if (p.is_tokens) {
      pp.ids = p.ids;
      pp.text = tok.decode(p.ids);
    } else {
      pp.text = p.text;
      if (r.add_bos) pp.ids.push_back(tok.eod());  // Megatron's add_BOS prepends the end-of-document token
      std::vector<int32_t> ids;
      try {
        ids = tok.encode(p.text);
      } catch (const Error& e) {  // a tokenizer that takes only some texts (NullTokenizer: integers)
        throw RequestError(400, fmt::format("the prompt cannot be tokenized: {}", e.what()));
      }
      pp.ids.insert(pp.ids.end(), ids.begin(), ids.end());
    }
    // Like `megatron generate`: nothing to continue starts a fresh document.
    if (pp.ids.empty()) pp.ids.push_back(tok.eod());
    pp.empty_text = pp.text.empty();
    pp.max_tokens = check_token_limits(static_cast<int64_t>(pp.ids.size()), r, l);
    out.push_back(std::move(pp));
  }
  return out;
}

const char* finish_reason(const Completion& c) {
  switch (c.finish) {
    case Finish::Length: return "length";
    case Finish::StopToken: return "stop";
    case Finish::Stopped: return c.stop_string ? "stop" : "cancelled";
    case Finish::Cancelled: return "cancelled";
  }
  return "length";
}

Completion run_completion(Backend& b, const ParsedRequest& r, const PreparedPrompt& p, uint64_t seed,
                          const StopCheck& should_stop, const PieceCallback& on_piece) {
  GenerateRequest g;
  g.prompt = p.ids;
  g.max_tokens = p.max_tokens;
  g.temperature = r.temperature;
  g.top_k = r.top_k;
  g.top_p = r.top_p;
  g.seed = seed;
  g.stop_id = r.stop_token ? static_cast<int32_t>(*r.stop_token) : b.tokenizer().eod();
  g.logprobs = r.logprobs;
  Completion c;
  TextStream text(b.tokenizer(), p.ids, p.empty_text, r.stop);
  GenerateResult res = b.generate(
      g,
      [&](const Token& t) {
        c.tokens.push_back(t.id);
        if (r.logprobs) c.logprobs.push_back(t.logprob);
        const std::string piece = text.push(t.id);
        if (!piece.empty() && !on_piece(piece)) return !(c.client_left = true);
        return !(c.stop_string = text.stopped());
      },
      should_stop);
  if (!c.client_left && !c.stop_string) {
    const std::string rest = text.finish();
    if (!rest.empty() && !on_piece(rest)) c.client_left = true;
  }
  c.text = text.text();
  c.finish = res.finish;
  c.prompt_logprobs = std::move(res.prompt_logprobs);
  return c;
}

}  // namespace mt::serve
