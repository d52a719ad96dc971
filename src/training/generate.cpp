// `megatron generate`: sample text from a checkpoint, for sanity checks.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "core/error.h"
#include "core/error_report.h"
#include "kernels/cpu/threads.h"
#include "training/commands.h"
#include "training/flag_parser.h"
#include "training/generation_model.h"
#include "training/trainer.h"

namespace mt {

int generate_main(const std::vector<std::string>& argv) {
  std::string load, prompt;
  int64_t max_new = 64, top_k = 0, threads = 0;
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 1234;
  FlagParser p("generate");
  p.value("--load", &load, "checkpoint directory (as given to pretrain --save)");
  p.value("--prompt", &prompt, "text to continue");
  // Bounded by the model's context below, once the prompt's length is known.
  p.value("--max-new-tokens", &max_new,
          "tokens to generate (default: 64, or what the context leaves; prompt + new tokens must fit the context)",
          {0, INT64_MAX});
  p.value("--temperature", &temperature, "sampling temperature (0 = greedy; default 1.0)");
  p.value("--top-k", &top_k, "keep the k most likely tokens (0 = all)", {0, model::limits::kVocab});
  p.value("--top-p", &top_p, "nucleus sampling: keep the most likely tokens whose probabilities sum to p, in (0, 1] "
                             "(default 1 = all)");
  p.value("--seed", &seed, "sampling seed (default 1234)");
  p.value("--num-threads", &threads, "CPU threads (default: all cores)", {0, kMaxThreads});
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (load.empty()) fail("--load DIR is required");
  // Written as "not in range" so a NaN fails too (the parser refuses nan; this keeps the rule here).
  if (!(temperature >= 0.f)) fail("--temperature must be >= 0 (got {})", temperature);
  if (!(top_p > 0.f && top_p <= 1.f)) fail("--top-p must be in (0, 1] (got {}); 1 keeps every token", top_p);
  cpu::set_num_threads(static_cast<int>(threads));
  // A checkpoint directory, or a HuggingFace model directory with its tokenizer's files.
  GenerationModel g = read_generation_model(load, std::nullopt);
  const Arguments& a = g.args;
  const data::Tokenizer* tok = g.tokenizer.get();

  std::vector<int32_t> ids = tok->encode(prompt);
  if (ids.empty()) ids.push_back(tok->eod());  // start a fresh document
  const size_t prompt_len = ids.size();
  // Megatron refuses prompt + tokens to generate beyond the model's context rather than
  // sliding a window the model was never trained on (or dropping the prompt's start).
  const int64_t S = a.model.seq_length, V = a.model.orig_vocab_size;
  const int64_t n_prompt = static_cast<int64_t>(prompt_len);
  if (n_prompt > S)
    fail("--prompt is {} tokens but the model's context is {} (its --seq-length): shorten the prompt", n_prompt, S);
  if (!p.given("--max-new-tokens")) max_new = std::min(max_new, S - n_prompt);  // the default fits any model
  if (max_new > S - n_prompt)  // n_prompt + max_new could overflow
    fail("--prompt ({} tokens) + --max-new-tokens ({}) exceeds the model's context of {} tokens (its --seq-length): "
         "use --max-new-tokens {} or less",
         n_prompt, max_new, S, S - n_prompt);
  build_generation_model(g, load, std::nullopt);
  model::GPTModel& m = *g.model;

  Activity generating("generating");
  Sampling s{temperature, top_k, top_p, seed, tok->eod()};
  generate_tokens(m, ids, V, max_new, s, [](int32_t, const std::vector<float>&) { return true; });
  std::printf("%s%s\n", prompt.c_str(), continuation(*tok, ids, prompt_len, prompt.empty()).c_str());
  return 0;
}

}  // namespace mt
