#pragma once
// The tiny training run the trainer, fp16 and checkpoint tests share: a deterministic sample
// source and the Arguments of a 2-layer Llama trained for a few steps on it. Each test sets its
// own differences (decay, evaluation, logging, fp16, ...) on the builder's result, then
// validates. The model-layer builders are in support/tiny_models.h.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/sample_source.h"
#include "support/tiny_models.h"
#include "training/arguments.h"

namespace mt::test {

// Deterministic in-memory samples: a repeating pattern with noise, so the model can learn.
// `n` samples of `S` + 1 token ids below `vocab`.
class PatternSource : public data::SampleSource {
 public:
  explicit PatternSource(int64_t S, int64_t n = 1000, int32_t vocab = 40) : n_(n), S_(S), vocab_(vocab) {}
  int64_t size() const override { return n_; }
  int64_t seq_length() const override { return S_; }
  void get(int64_t index, int32_t* t) const override {
    for (int64_t i = 0; i <= S_; ++i)
      t[i] = static_cast<int32_t>((index * 7 + i * 3 + (i % 4 == 0 ? index : 0)) % vocab_);
  }

 private:
  int64_t n_, S_;
  int32_t vocab_;
};

// The trainer tests' tiny Llama: 2 layers 32 wide, 4 heads in 2 query groups (as if
// --num-query-groups were given), 16 tokens, the vocabulary padded to a multiple of 16; mock
// data, micro-batches of 2 in a global batch of 4, 8 iterations at lr 3e-3 after 2 of warm-up
// (the default linear decay to 0), no evaluation, no progress bar; saves to `save` and loads
// from `load` where given. Not validated: the caller sets its differences, then calls
// validate_args(a, 40) (PatternSource's vocabulary).
inline Arguments tiny_llama_args(const std::string& save = "", const std::string& load = "") {
  Arguments a;
  a.given = {"--num-query-groups"};
  a.group_query_attention = true;
  auto& m = a.model;
  m.num_layers = 2;
  m.hidden_size = 32;
  m.num_attention_heads = 4;
  m.num_query_groups = 2;
  m.seq_length = 16;
  use_llama_blocks(m);
  a.make_vocab_size_divisible_by = 16;
  a.data.mock = true;
  a.micro_batch_size = 2;
  a.global_batch_size = 4;
  a.train_iters = 8;
  a.optimizer.lr = 3e-3f;
  a.lr_warmup_iters = 2;
  a.eval_iters = 0;
  a.log_progress_bar = false;
  a.save = save;
  a.load = load;
  return a;
}

// The error text of parsing and validating a small pretrain command line with `flags` added
// ("" when accepted; the validated Arguments go to `out`). For the flag-rule tests.
inline std::string pretrain_args_error(const std::vector<std::string>& flags, Arguments* out = nullptr) {
  std::vector<std::string> argv{"--num-layers", "2",    "--hidden-size",      "32", "--num-attention-heads", "4",
                                "--seq-length", "16",   "--micro-batch-size", "2",  "--train-iters",         "2",
                                "--lr",         "1e-3", "--mock-data"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  try {
    Arguments a = parse_pretrain_args(argv);
    validate_args(a, 64);
    if (out) *out = a;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mt::test
