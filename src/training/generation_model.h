#pragma once
// A model loaded for generation (`megatron generate`, `megatron serve`): one rank, fp32 on the
// CPU, no dropout, from a checkpoint directory or a HuggingFace model directory with its
// tokenizer. Shared so that the server's answers are exactly what `generate` prints.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/gpt_model.h"
#include "training/arguments.h"

namespace mt {

struct GenerationModel {
  Arguments args;  // the model's settings (seq_length is its context)
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<model::GPTModel> model;
  int64_t context() const { return args.model.seq_length; }
  int64_t vocab() const { return args.model.orig_vocab_size; }  // padded entries are never sampled
};

// The model's settings and tokenizer only (nothing built): reads `load` (checkpoint at
// `iteration`, default the latest, or a HuggingFace directory). Fails naming --load/--iteration.
GenerationModel read_generation_model(const std::string& load, std::optional<int64_t> iteration);
// Builds the model described by `g` and loads its weights from `load`.
void build_generation_model(GenerationModel& g, const std::string& load, std::optional<int64_t> iteration);

// Picks a token from logits with temperature (0 = greedy), top-k (0 = all) and top-p (nucleus,
// 1 = all) filtering; `u` is a uniform draw in [0, 1).
int32_t sample_token(std::vector<float> logits, float temperature, int64_t top_k, float top_p, float u);

struct Sampling {
  float temperature = 1.f;  // 0 = greedy
  int64_t top_k = 0;        // 0 = all
  float top_p = 1.f;        // 1 = all
  uint64_t seed = 1234;     // draw n is Philox::uniform(seed, 7, n)
  int32_t stop_id = -1;     // generation ends after this token (the end-of-document token)
};
// Appends up to `max_new` sampled tokens to `ids` (one full forward over the sequence per token:
// no KV cache). After each token, `on_token(id, logits)` sees it with the real vocabulary's
// logits that produced it; returning false stops. Returns the number of tokens appended.
using OnToken = std::function<bool(int32_t id, const std::vector<float>& logits)>;
int64_t generate_tokens(model::GPTModel& m, std::vector<int32_t>& ids, int64_t vocab, int64_t max_new,
                        const Sampling& s, const OnToken& on_token);

// The text of ids[prompt_len:] as it reads after the prompt's own text (see generate.cpp).
std::string continuation(const data::Tokenizer& tok, const std::vector<int32_t>& ids, size_t prompt_len,
                         bool empty_prompt);

}  // namespace mt
