// `megatron generate`: sample text from a checkpoint, for sanity checks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/philox.h"
#include "kernels/cpu/threads.h"
#include "model/gpt_model.h"
#include "training/commands.h"
#include "training/flag_parser.h"
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

int generate_main(const std::vector<std::string>& argv) {
  std::string load, prompt;
  int64_t max_new = 64, top_k = 0, threads = 0;
  float temperature = 1.0f, top_p = 0.f;
  uint64_t seed = 1234;
  FlagParser p("generate");
  p.value("--load", &load, "checkpoint directory (as given to pretrain --save)");
  p.value("--prompt", &prompt, "text to continue");
  p.value("--max-new-tokens", &max_new, "tokens to generate (default 64)");
  p.value("--temperature", &temperature, "sampling temperature (0 = greedy; default 1.0)");
  p.value("--top-k", &top_k, "keep the k most likely tokens (0 = all)");
  p.value("--top-p", &top_p, "nucleus sampling threshold (0 = off)");
  p.value("--seed", &seed, "sampling seed (default 1234)");
  p.value("--num-threads", &threads, "CPU threads");
  p.parse(argv);
  if (p.help_requested()) {
    std::fputs(p.help().c_str(), stdout);
    return 0;
  }
  if (load.empty()) fail("--load DIR is required");
  if (max_new < 0) fail("--max-new-tokens must be >= 0");
  if (temperature < 0) fail("--temperature must be >= 0");
  if (top_p < 0 || top_p > 1) fail("--top-p must be in [0, 1]");
  cpu::set_num_threads(static_cast<int>(threads));
  auto it = checkpoint::latest_iteration(load);
  if (!it) fail("--load {}: no latest_checkpointed_iteration.txt (not a checkpoint directory)", load);
  auto st = checkpoint::read_state(load, *it);
  Arguments a;
  model_args_from_json(st.args, a);
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  auto tok = data::build_tokenizer(a.tokenizer);
  model::GPTModel m(a.model);
  checkpoint::LoadOptions lo;
  lo.load_optim = false;
  checkpoint::load_checkpoint(load, *it, m.params(), nullptr, lo);

  std::vector<int32_t> ids = tok->encode(prompt);
  if (ids.empty()) ids.push_back(tok->eod());  // start a fresh document
  const size_t prompt_len = ids.size();
  const int64_t S = a.model.seq_length, V = a.model.orig_vocab_size;
  for (int64_t n = 0; n < max_new; ++n) {
    std::vector<int32_t> window(ids.end() - std::min<int64_t>(static_cast<int64_t>(ids.size()), S), ids.end());
    const int64_t T = static_cast<int64_t>(window.size());
    Tensor logits = m.logits(window, 1, T);
    const float* last = logits.data<float>() + (T - 1) * a.model.vocab_size;
    std::vector<float> l(last, last + V);  // padded vocabulary entries are never sampled
    int32_t next = sample_token(l, temperature, top_k, top_p, Philox::uniform(seed, 7, static_cast<uint64_t>(n)));
    ids.push_back(next);
    if (next == tok->eod()) break;
  }
  std::vector<int32_t> gen(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end());
  std::printf("%s%s\n", prompt.c_str(), tok->decode(gen).c_str());
  return 0;
}

}  // namespace mt
