// FP8-weight inference on the GPU (cuBLASLt FP8 GEMMs on 1-byte weight codes, bf16 activations)
// against the CPU's emulation of the same arithmetic (fp32 activations), on the FP8-trained
// fixture: logits close, greedy tokens equal, with and without CUDA graphs; decode's few rows
// go through the padded GEMM. Labelled gpu (test names *Gpu*).
#include <gtest/gtest.h>

#include "engine_support.h"
#include "fp8_fixture.h"
#include "model/fp8_inference.h"
#include "support/gpu.h"

namespace mt::test {
namespace {

std::vector<inference::Completion> greedy_runs(model::GPTModel& m, bool graphs) {
  std::vector<inference::Request> reqs;
  for (const auto& p : pattern_prompts()) {
    inference::Request r;
    r.prompt = p;
    r.max_new_tokens = 8;
    reqs.push_back(r);
  }
  inference::EngineOptions o;
  o.max_batch = 4;
  o.cuda_graphs = graphs;
  return run_engine(m, reqs, o);
}

TEST(Fp8InferenceGpu, MatchesTheCpuEmulation) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  gpu();
  const std::string dir = fp8_trained_checkpoint();
  InferenceModel cpu = load_inference_model(dir, -1, Device::CPU, false, nullptr, true);
  InferenceModel dev = load_inference_model(dir, -1, Device::CUDA, false, nullptr, true);
  for (const model::Fp8LinearState& l : dev.model->fp8()->linears())
    EXPECT_TRUE(l.weight_epoch == model::kFp8FrozenEpoch && l.weight_codes.defined())
        << l.name << ": not on the real FP8 GEMM path";
  double worst = 0;
  for (const auto& p : pattern_prompts()) {
    const Tensor lc = prefill_logits(*cpu.model, p), lg = prefill_logits(*dev.model, p);
    worst = std::max(worst, relative_l2(lg, lc));
  }
  // bf16 activations against fp32 ones, each then rounded through E4M3: an input near a rounding
  // boundary lands on the other code (a step of 1/16 relative) now and then.
  EXPECT_LT(worst, 0.05);
  const auto want = greedy_runs(*cpu.model, false);
  for (const bool graphs : {false, true}) {
    const auto got = greedy_runs(*dev.model, graphs);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i << (graphs ? " (CUDA graphs)" : "");
  }
  std::printf("[ fp8 infer gpu ] prefill logits relative L2 to the CPU emulation %.4f (worst prompt)\n", worst);
}

}  // namespace
}  // namespace mt::test
