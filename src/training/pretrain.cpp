// `megatron pretrain`: parse and validate Megatron's flags, build tokenizer, data, model and
// optimizer, then train.
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/threads.h"
#include "training/commands.h"
#include "training/trainer.h"

namespace mt {

std::unique_ptr<data::Tokenizer> tokenizer_for(Arguments& a) {
  if (a.tokenizer.type.empty()) {
    if (!a.data.mock) fail("--tokenizer-type is required");
    if (a.tokenizer.vocab_size <= 0) fail("--mock-data without a tokenizer needs --vocab-size N (NullTokenizer)");
    a.tokenizer.type = "NullTokenizer";
  }
  return data::build_tokenizer(a.tokenizer);
}

int pretrain_main(const std::vector<std::string>& argv) {
  Arguments a;
  try {
    a = parse_pretrain_args(argv);
  } catch (const Error& e) {
    std::string what = e.what();
    if (what.rfind("help:", 0) == 0) {
      std::fputs(what.c_str() + 5, stdout);
      return 0;
    }
    throw;
  }
  if (a.device == "cuda") fail("--device cuda: this build has no CUDA backend yet; use --device cpu");
  int threads = cpu::set_num_threads(static_cast<int>(a.num_threads));
  auto tok = tokenizer_for(a);
  validate_args(a, tok->vocab_size());
  a.data.eod = tok->eod();
  a.data.mock_vocab_size = tok->vocab_size();
  log_info("megatron.cpp pretrain | device: cpu ({} threads) | tokenizer: {} (vocab {}, eod {})", threads, tok->name(),
           tok->vocab_size(), tok->eod());

  const int64_t gbs = a.global_batch_size;
  const int64_t iters = a.train_iters > 0 ? a.train_iters : a.train_samples / gbs;
  const int64_t eval_runs = a.eval_iters > 0 ? iters / a.eval_interval + 2 : 0;
  int64_t num_samples[3] = {iters * gbs, eval_runs * a.eval_iters * gbs, a.eval_iters * gbs};
  auto splits = data::build_gpt_datasets(a.data, num_samples);
  if (!splits.train) fail("the train split is empty: check --split and --data-path");
  if (a.eval_iters > 0 && !splits.valid) log_warn("the validation split is empty: no evaluation (check --split)");

  Trainer trainer(a, std::move(tok));
  trainer.set_data(std::move(splits.train), std::move(splits.valid));
  return trainer.run();
}

}  // namespace mt
