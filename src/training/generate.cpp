// `megatron generate`: sample text from a checkpoint, for sanity checks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/model_args.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/philox.h"
#include "kernels/cpu/threads.h"
#include "model/gpt_model.h"
#include "training/commands.h"
#include "training/convert.h"
#include "training/flag_parser.h"
#include "training/hf_tokenizer_files.h"
#include "training/memory_check.h"
#include "training/trainer.h"

namespace mt {

// Picks a token from logits with temperature, top-k and top-p (nucleus) filtering.
int32_t sample_token(std::vector<float> logits, float temperature, int64_t top_k, float top_p, float u) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (temperature <= 0.f) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
  int64_t keep = top_k > 0 ? std::min(top_k, V) : V;
  double mx = logits[static_cast<size_t>(idx[0])];
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / temperature);
  if (top_p > 0.f && top_p < 1.f) {
    double c = 0;
    for (int64_t i = 0; i < keep; ++i) {
      c += p[static_cast<size_t>(i)] / sum;
      if (c >= top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  double r = u * sum, c = 0;
  for (int64_t i = 0; i < keep; ++i) {
    c += p[static_cast<size_t>(i)];
    if (r < c) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(keep - 1)];
}

namespace {

// The continuation as text that joins the prompt the way the tokenizer would: decoding the
// generated ids alone loses the separator between the last prompt token and the first new one
// (the Null tokenizer's "... 8" + "9 10" printed "... 89 10"), so the whole sequence is decoded
// and the prompt's own decoding cut off its front. Where a tokenizer's decoding of the prompt is
// not a prefix of the whole (a byte-level merge across the boundary), the generated ids are
// decoded alone, as before.
std::string continuation(const data::Tokenizer& tok, const std::vector<int32_t>& ids, size_t prompt_len,
                         bool empty_prompt) {
  const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prompt_len));
  const std::vector<int32_t> gen(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end());
  if (empty_prompt) return tok.decode(gen);  // nothing printed before it to join
  const std::string whole = tok.decode(ids), prefix = tok.decode(head);
  if (whole.compare(0, prefix.size(), prefix) == 0) return whole.substr(prefix.size());
  return tok.decode(gen);
}

}  // namespace

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
  const bool hf = checkpoint::detect_checkpoint(load) == checkpoint::CheckpointKind::HuggingFace;
  std::optional<int64_t> it;
  Arguments a;
  if (hf) {
    const checkpoint::HfSpec spec = checkpoint::read_hf_config(load);
    apply_hf_config(a, spec, (std::filesystem::path(load) / "config.json").string());
    apply_hf_vocab(a, spec, 0, load);
    if (!tokenizer_of_hf_dir(load, a.tokenizer))
      fail("--load {}: a HuggingFace model without tokenizer files (tokenizer.json, vocab.json + merges.txt, or "
           "tokenizer.model); copy its tokenizer into the directory",
           load);
  } else {
    it = checkpoint::latest_iteration(load);
    if (!it) fail("--load {}: no latest_checkpointed_iteration.txt (not a checkpoint directory)", load);
    auto st = checkpoint::read_state(load, *it);
    checkpoint::model_args_from_json(st.args, a.model, a.tokenizer);
    checkpoint::use_saved_tokenizer(checkpoint::iteration_dir(load, *it), st.args, a.tokenizer);
  }
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  a.model.finalize();
  auto tok = data::build_tokenizer(a.tokenizer);

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
  check_host_memory(a.model, 4, 1, checked_product({S, a.model.vocab_size, 4}, "logits bytes"),
                    "its fp32 parameters and the logits of its context");

  std::optional<Activity> building(std::in_place, "building the model");
  model::GPTModel m(a.model);
  if (hf) {
    checkpoint::load_hf_weights(load, m.params(), m.config());
  } else {
    checkpoint::LoadOptions lo;
    lo.load_optim = false;
    checkpoint::load_checkpoint(load, *it, m.params(), nullptr, lo);
  }
  building.reset();

  Activity generating("generating");
  for (int64_t n = 0; n < max_new; ++n) {
    const int64_t T = static_cast<int64_t>(ids.size());
    Tensor logits = m.logits(ids, 1, T);
    const float* last = logits.data<float>() + (T - 1) * a.model.vocab_size;
    std::vector<float> l(last, last + V);  // padded vocabulary entries are never sampled
    int32_t next = sample_token(l, temperature, top_k, top_p, Philox::uniform(seed, 7, static_cast<uint64_t>(n)));
    ids.push_back(next);
    if (next == tok->eod()) break;
  }
  std::printf("%s%s\n", prompt.c_str(), continuation(*tok, ids, prompt_len, prompt.empty()).c_str());
  return 0;
}

}  // namespace mt
