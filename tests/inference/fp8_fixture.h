#pragma once
// FP8 inference's fixture: the tiny Llama, 64 wide (every GEMM dimension a multiple of 16, as
// cuBLASLt's FP8 GEMMs need), trained with FP8 (hybrid, delayed scaling: the CPU's emulation) on
// the learnable PatternSource and saved once per test process. Its predictions are confident,
// so FP8's rounding seldom flips a greedy token; its saved arguments say it was trained in FP8.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "inference/model_runner.h"
#include "kernels/test_util.h"
#include "support/tiny_training.h"
#include "training/inference_load.h"
#include "training/trainer.h"

namespace mt::test {

inline std::string fp8_trained_checkpoint() {
  static const std::string dir = [] {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("mt_fp8_inference_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    Arguments a = tiny_llama_args(d.string());
    a.model.hidden_size = 64;
    a.model.ffn_hidden_size = 128;
    a.model.fp8.enabled = true;
    a.model.fp8.hybrid = true;
    a.tokenizer.type = "NullTokenizer";  // saved with the checkpoint: the loader builds it
    a.tokenizer.vocab_size = 39;         // ids 0..38, EOD 39: PatternSource's 40
    a.device = "cpu";  // the emulation: the same fixture whether or not a GPU is visible
    a.train_iters = 60;
    a.optimizer.lr = 1e-2f;
    validate_args(a, 40);
    Trainer t(a, nullptr);
    t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
    for (int64_t i = 0; i < a.train_iters; ++i) t.train_step();
    t.save();
    t.wait_for_saves();
    return d.string();
  }();
  return dir;
}

// The fp32 host logits [n, V] of every position of `ids` (one sequence), prefilled in one pass.
inline Tensor prefill_logits(model::GPTModel& m, const std::vector<int32_t>& ids) {
  inference::ModelRunner run(m, 1, static_cast<int64_t>(ids.size()));
  inference::StepBatch b;
  for (size_t i = 0; i < ids.size(); ++i) {
    b.tokens.push_back(ids[i]);
    b.slots.push_back(0);
    b.positions.push_back(static_cast<int32_t>(i));
    b.logit_rows.push_back(static_cast<int32_t>(i));
  }
  return run.forward(b);
}

// ||a - b|| / ||b|| over two fp32 host tensors.
inline double relative_l2(const Tensor& a, const Tensor& b) { return rel_l2(a.to_vector(), b.to_vector()); }

// Prompts of the pattern the fixture learned (PatternSource's samples' starts).
inline std::vector<std::vector<int32_t>> pattern_prompts() {
  std::vector<std::vector<int32_t>> ps;
  for (int64_t index : {3, 11, 29, 120}) {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < 6; ++i)
      p.push_back(static_cast<int32_t>((index * 7 + i * 3 + (i % 4 == 0 ? index : 0)) % 40));
    ps.push_back(p);
  }
  return ps;
}

}  // namespace mt::test
