// The opt-in decode kernels (ops::DecodeKernels, MT_DECODE_FUSED=1; issue #22) against the CPU
// references and against the default GPU kernels. Labelled gpu (test names *Gpu*).
//   argmax_rows: exact (the same max-then-lowest-index rule, any scan order gives the same id).
//   cached_attention: within 2e-2 of the CPU's fp32 result, the default kernel's tolerance (the
//   output is rounded to bf16, |out| <= 1; fp32 sums in another order than the default kernel's).
//   The engine: the same greedy tokens as the default kernels (as GEMV vs cuBLASLt: differences
//   only in fp32 summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "engine_support.h"
#include "gpu_support.h"
#include "inference/model_runner.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "support/gpu.h"

namespace mt::test {
namespace {

Tensor to_gpu(const Tensor& t, DType dt = DType::BF16) { return t.to(dt).to_device(Device::CUDA); }
Tensor from_gpu(const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32); }

std::vector<int32_t> ints(const Tensor& t) {
  const Tensor h = t.to_device(Device::CPU);
  return std::vector<int32_t>(h.data<int32_t>(), h.data<int32_t>() + h.numel());
}

// Rows of a 128k-like vocabulary (and small ones), bf16 and fp16 and fp32, with planted ties (the
// lowest index must win), NaNs (never chosen), a row of NaN (0), and a larger value in the padded
// tail (never chosen).
TEST(DecodeKernelsGpu, ArgmaxRowsEqualsTheCpu) {
  MT_REQUIRE_GPU();
  struct Case {
    int64_t R, Vp, vocab;
  };
  for (const Case& c : {Case{1, 128256, 128255}, Case{3, 1024, 1000}, Case{5, 64, 64}, Case{2, 8, 3}}) {
    Tensor l = random_bf16_values({c.R, c.Vp}, 11 + static_cast<uint32_t>(c.Vp));
    float* p = l.data<float>();
    for (int64_t r = 0; r < c.R; ++r) {
      float* row = p + r * c.Vp;
      if (c.vocab < c.Vp) row[c.vocab] = 4.f;  // the padded tail: out of the vocabulary
      if (r == 0) {
        row[c.vocab - 1] = 2.f;  // a tie, the lower index wins
        row[c.vocab / 2] = 2.f;
        row[0] = std::nanf("");
      }
      if (r == 1 && c.R > 1)
        for (int64_t v = 0; v < c.Vp; ++v) row[v] = std::nanf("");
    }
    const std::vector<int32_t> want = ints(ops::argmax_rows(l, c.vocab));
    for (const DType dt : {DType::BF16, DType::F16, DType::F32}) {
      const Tensor g = to_gpu(l, dt);
      const std::vector<int32_t> dflt = ints(ops::argmax_rows(g, c.vocab));
      ops::DecodeKernels on;
      const std::vector<int32_t> got = ints(ops::argmax_rows(g, c.vocab));
      EXPECT_EQ(got, want) << "R " << c.R << " V' " << c.Vp << " dtype " << dtype_name(dt);
      EXPECT_EQ(got, dflt) << "R " << c.R << " V' " << c.Vp << " dtype " << dtype_name(dt);
    }
  }
}

// Rows of several slots at positions short and long (one split, several, some splits empty),
// group sizes 1..8 and head dims 64 and 128 (the decode kernel's), plus shapes it leaves to the
// default kernel (D 80, fp32): all within the default kernel's tolerance of the CPU.
TEST(DecodeKernelsGpu, CachedAttentionMatchesTheCpu) {
  MT_REQUIRE_GPU();
  struct Case {
    int64_t Hq, G, D, N, L;
  };
  for (const Case& cs : {Case{32, 8, 64, 1, 385}, Case{32, 8, 64, 1, 4096}, Case{32, 8, 64, 3, 700},
                         Case{8, 8, 64, 2, 300}, Case{16, 8, 64, 1, 129}, Case{64, 8, 128, 1, 700},
                         Case{24, 4, 128, 4, 260}, Case{8, 1, 64, 1, 50}, Case{32, 8, 64, 37, 700},
                         Case{6, 6, 80, 3, 200}}) {
    const int64_t slots = 3, L = cs.L;
    Tensor kc = random_bf16_values({slots, cs.G, L, cs.D}, 1), vc = random_bf16_values({slots, cs.G, L, cs.D}, 2);
    const Tensor q = random_bf16_values({1, cs.Hq, cs.N, cs.D}, 3);
    std::vector<int32_t> slot, pos;
    for (int64_t i = 0; i < cs.N; ++i) {
      slot.push_back(static_cast<int32_t>((i * 7 + 1) % slots));
      pos.push_back(static_cast<int32_t>(i == 0 ? L - 1 : i == 1 ? 0 : (i * 131) % L));
    }
    const Tensor gs = Tensor::from_vector(slot, {cs.N}).to_device(Device::CUDA);
    const Tensor gp = Tensor::from_vector(pos, {cs.N}).to_device(Device::CUDA);
    const Tensor cs_t = Tensor::from_vector(slot, {cs.N}), cp_t = Tensor::from_vector(pos, {cs.N});
    const float scale = 1.f / std::sqrt(static_cast<float>(cs.D));
    const std::string what = "Hq " + std::to_string(cs.Hq) + " G " + std::to_string(cs.G) + " D " +
                             std::to_string(cs.D) + " N " + std::to_string(cs.N) + " L " + std::to_string(L);
    const Tensor want = ops::cached_attention(q, kc, vc, cs_t, cp_t, scale);
    const Tensor gq = to_gpu(q), gkc = to_gpu(kc), gvc = to_gpu(vc);
    const Tensor dflt = from_gpu(ops::cached_attention(gq, gkc, gvc, gs, gp, scale));
    ops::DecodeKernels on;
    const Tensor got = from_gpu(ops::cached_attention(gq, gkc, gvc, gs, gp, scale));
    EXPECT_LT(max_abs_diff(got, want), 2e-2) << what;
    EXPECT_LT(max_abs_diff(got, dflt), 2e-2) << what;
    // fp16 caches take the same kernel.
    const Tensor got16 =
        from_gpu(ops::cached_attention(to_gpu(q, DType::F16), to_gpu(kc, DType::F16), to_gpu(vc, DType::F16), gs, gp, scale));
    EXPECT_LT(max_abs_diff(got16, want), 2e-2) << what << " fp16";
  }
}

// The engine with MT_DECODE_FUSED=1 (read when the runner is built) against the default kernels:
// the same greedy tokens, one request at a time and batched, eager and graphed.
TEST(DecodeKernelsGpu, EngineTokensEqualTheDefaultKernels) {
  MT_REQUIRE_GPU();
  for (const std::string& f : {std::string("llama"), std::string("qwen3"), std::string("gpt2")}) {
    model::TransformerConfig c = family_config(f);
    c.bf16 = true;
    model::GPTModel m(c);
    m.to_device(Device::CUDA);
    const int64_t V = c.orig_vocab_size;
    std::vector<inference::Request> reqs;
    for (int i = 0; i < 3; ++i) {
      inference::Request r;
      r.prompt = make_prompt(2 + 5 * i, 90 + static_cast<uint32_t>(i), V);
      r.max_new_tokens = 16;
      reqs.push_back(r);
    }
    for (const bool graphs : {false, true}) {
      for (const int64_t batch : {int64_t{1}, int64_t{3}}) {
        inference::EngineOptions o;
        o.max_batch = batch;
        o.cuda_graphs = graphs;
        unsetenv("MT_DECODE_FUSED");
        const auto want = run_engine(m, reqs, o);
        setenv("MT_DECODE_FUSED", "1", 1);
        const auto got = run_engine(m, reqs, o);
        unsetenv("MT_DECODE_FUSED");
        for (size_t i = 0; i < reqs.size(); ++i)
          EXPECT_EQ(got[i].tokens, want[i].tokens) << f << " graphs " << graphs << " batch " << batch << " request " << i;
      }
    }
    setenv("MT_DECODE_FUSED", "1", 1);
    inference::ModelRunner fused(m, 1, 32);
    unsetenv("MT_DECODE_FUSED");
    inference::ModelRunner dflt(m, 1, 32);
    EXPECT_TRUE(fused.decode_kernels());
    EXPECT_FALSE(dflt.decode_kernels());
  }
}

}  // namespace
}  // namespace mt::test
