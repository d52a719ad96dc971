#pragma once
// What the estimate tests share: the bench scripts' shapes as flag lists, and a run's estimate
// from its flags (tests/training/estimate_test.cpp, estimate_fp8_test.cpp).
#include <string>
#include <vector>

#include "training/estimate.h"

namespace mt::estimate::shapes {

using Args = std::vector<std::string>;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

inline Args operator+(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The bench scripts' shapes (bench/llama_1_5b.sh, bench/moe_2b.sh, bench/gpu_bench.sh,
// bench/gpu_dist_bench.sh, bench/cpu_train_bench.sh) and the flags every GPU run adds.
// A Llama-3-style model (GQA 8 groups, SwiGLU, RoPE base 500000, untied, the 128k vocabulary).
inline Args llama(const char* layers, const char* hidden, const char* heads, const char* ffn, const char* seq,
                  const char* mbs) {
  return {"--num-layers", layers, "--hidden-size", hidden, "--num-attention-heads", heads, "--group-query-attention",
          "--num-query-groups", "8", "--ffn-hidden-size", ffn, "--seq-length", seq, "--max-position-embeddings", seq,
          "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--rotary-base", "500000",
          "--disable-bias-linear", "--untie-embeddings-and-output-weights", "--vocab-size", "128255",
          "--micro-batch-size", mbs};
}
inline const Args kLlama15 = llama("16", "2048", "32", "8192", "2048", "4");
inline const Args kLlama8 = llama("32", "4096", "32", "14336", "4096", "1");
inline const Args kGpu = {"--bf16", "--device", "cuda", "--attention-dropout", "0", "--hidden-dropout", "0", "--lr",
                          "1e-4", "--clip-grad", "1.0"};

inline Arguments run_args(const Args& argv, int64_t world, const Options& base = {}) {
  Arguments a = parse_pretrain_args(argv, "estimate", {});
  Options o = base;
  o.world_size = world;
  return validated(a, o, a.tokenizer.vocab_size);
}

inline Estimate run(const Args& argv, int64_t world = 1, const Options& o = {}) {
  return estimate(run_args(argv, world, o), o);
}

// What the trainer's "peak GPU memory" line reports: rank 0's tensor pool (the log line is
// printed by global rank 0, the first pipeline stage). Until d8fa4fc (session 9) the GPU AdamW
// took its moments with raw cudaMalloc, outside the pool, so rows measured before it read the
// pool without the optimizer state (BENCHMARKS.md, session 9: 36.44 against 25.27 GiB).
inline double logged_peak_gib(const Estimate& e, bool moments_in_pool) {
  const StageMemory& s = e.stages.front();
  return (s.pool_peak() - (moments_in_pool ? 0.0 : s.optimizer)) / kGiB;
}

}  // namespace mt::estimate::shapes
