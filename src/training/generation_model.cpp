#include "training/generation_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/model_args.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/error_report.h"
#include "core/philox.h"
#include "training/convert.h"
#include "training/hf_tokenizer_files.h"
#include "training/memory_check.h"

namespace mt {

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

int64_t generate_tokens(model::GPTModel& m, std::vector<int32_t>& ids, int64_t vocab, int64_t max_new,
                        const Sampling& s, const OnToken& on_token) {
  const int64_t Vp = m.config().vocab_size;
  for (int64_t n = 0; n < max_new; ++n) {
    const int64_t T = static_cast<int64_t>(ids.size());
    Tensor logits = m.logits(ids, 1, T);
    const float* last = logits.data<float>() + (T - 1) * Vp;
    std::vector<float> l(last, last + vocab);  // padded vocabulary entries are never sampled
    const int32_t next = sample_token(l, s.temperature, s.top_k, s.top_p,
                                      Philox::uniform(s.seed, 7, static_cast<uint64_t>(n)));
    ids.push_back(next);
    if (!on_token(next, l) || next == s.stop_id) return n + 1;
  }
  return max_new;
}

// Decoding the generated ids alone loses the separator between the last prompt token and the
// first new one (the Null tokenizer's "... 8" + "9 10" printed "... 89 10"), so the whole
// sequence is decoded and the prompt's own decoding cut off its front. Where a tokenizer's
// decoding of the prompt is not a prefix of the whole (a byte-level merge across the boundary),
// the generated ids are decoded alone.
std::string continuation(const data::Tokenizer& tok, const std::vector<int32_t>& ids, size_t prompt_len,
                         bool empty_prompt) {
  const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prompt_len));
  const std::vector<int32_t> gen(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end());
  if (empty_prompt) return tok.decode(gen);  // nothing printed before it to join
  const std::string whole = tok.decode(ids), prefix = tok.decode(head);
  if (whole.compare(0, prefix.size(), prefix) == 0) return whole.substr(prefix.size());
  return tok.decode(gen);
}

namespace {

bool is_hf(const std::string& load) {
  return checkpoint::detect_checkpoint(load) == checkpoint::CheckpointKind::HuggingFace;
}

// The iteration to read: the one asked for (which must exist) or the latest.
int64_t pick_iteration(const std::string& load, std::optional<int64_t> iteration) {
  const std::optional<int64_t> latest = checkpoint::latest_iteration(load);
  if (!latest) fail("--load {}: no latest_checkpointed_iteration.txt (not a checkpoint directory)", load);
  if (!iteration) return *latest;
  if (!std::filesystem::is_directory(checkpoint::iteration_dir(load, *iteration)))
    fail("--iteration {}: --load {} has no such saved iteration (no {}); the latest is {}", *iteration, load,
         checkpoint::iteration_dir(load, *iteration), *latest);
  return *iteration;
}

}  // namespace

GenerationModel read_generation_model(const std::string& load, std::optional<int64_t> iteration) {
  GenerationModel g;
  Arguments& a = g.args;
  if (is_hf(load)) {
    if (iteration) fail("--iteration {}: --load {} is a HuggingFace model, which has no iterations", *iteration, load);
    const checkpoint::HfSpec spec = checkpoint::read_hf_config(load);
    apply_hf_config(a, spec, (std::filesystem::path(load) / "config.json").string());
    apply_hf_vocab(a, spec, 0, load);
    if (!tokenizer_of_hf_dir(load, a.tokenizer))
      fail("--load {}: a HuggingFace model without tokenizer files (tokenizer.json, vocab.json + merges.txt, or "
           "tokenizer.model); copy its tokenizer into the directory",
           load);
  } else {
    const int64_t it = pick_iteration(load, iteration);
    auto st = checkpoint::read_state(load, it);
    checkpoint::model_args_from_json(st.args, a.model, a.tokenizer);
    checkpoint::use_saved_tokenizer(checkpoint::iteration_dir(load, it), st.args, a.tokenizer);
  }
  a.model.attention_dropout = a.model.hidden_dropout = 0.f;
  a.model.finalize();
  g.tokenizer = data::build_tokenizer(a.tokenizer);
  return g;
}

void build_generation_model(GenerationModel& g, const std::string& load, std::optional<int64_t> iteration) {
  const model::TransformerConfig& m = g.args.model;
  check_host_memory(m, 4, 1, checked_product({m.seq_length, m.vocab_size, 4}, "logits bytes"),
                    "its fp32 parameters and the logits of its context");
  Activity building("building the model");
  g.model = std::make_unique<model::GPTModel>(m);
  if (is_hf(load)) {
    checkpoint::load_hf_weights(load, g.model->params(), g.model->config());
  } else {
    checkpoint::LoadOptions lo;
    lo.load_optim = false;
    checkpoint::load_checkpoint(load, pick_iteration(load, iteration), g.model->params(), nullptr, lo);
  }
}

}  // namespace mt
