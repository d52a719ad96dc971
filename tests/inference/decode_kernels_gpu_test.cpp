// The decode kernels (ops::DecodeKernels, the default since session 16; MT_DECODE_FUSED=0 turns
// them off; issue #22) against the CPU references and against the general GPU kernels, and the
// decode graphs' arena (the default; MT_DECODE_ARENA=0 turns it off). Labelled gpu (test names *Gpu*).
//   argmax_rows: exact (the same max-then-lowest-index rule, any scan order gives the same id).
//   cached_attention: within 2e-2 of the CPU's fp32 result, the default kernel's tolerance (the
//   output is rounded to bf16, |out| <= 1; fp32 sums in another order than the default kernel's);
//   its split merge fused into the attention kernel bit for bit the merge kernel's.
//   The engine: the same greedy tokens as the general kernels (as GEMV vs cuBLASLt: differences
//   only in fp32 summation order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  // Up to 64 rows the decode kernel splits each row over blocks (ties and NaNs across blocks);
  // past that it takes the one-block-per-row kernel: both are checked.
  for (const Case& c : {Case{1, 128256, 128255}, Case{3, 1024, 1000}, Case{5, 64, 64}, Case{2, 8, 3},
                        Case{80, 4096, 4000}}) {
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
    // The split merge in the attention kernel's last block (the default) and as a kernel of its
    // own (the decode fusions off, as MT_DECODE_FUSIONS=0 sets them for a runner): the same
    // arithmetic, the same bits; a second fused call (its arrival counters reset by the first) too.
    Tensor merged_apart;
    {
      const ops::DecodeKernels unfused(true, false);
      EXPECT_FALSE(ops::DecodeKernels::fusions());
      merged_apart = from_gpu(ops::cached_attention(gq, gkc, gvc, gs, gp, scale));
    }
    EXPECT_TRUE(ops::DecodeKernels::fusions());
    EXPECT_EQ(max_abs_diff(got, merged_apart), 0.0) << what;
    EXPECT_EQ(max_abs_diff(from_gpu(ops::cached_attention(gq, gkc, gvc, gs, gp, scale)), got), 0.0) << what;
    // fp16 caches take the same kernel.
    const Tensor got16 =
        from_gpu(ops::cached_attention(to_gpu(q, DType::F16), to_gpu(kc, DType::F16), to_gpu(vc, DType::F16), gs, gp, scale));
    EXPECT_LT(max_abs_diff(got16, want), 2e-2) << what << " fp16";
  }
}

// Three greedy requests of different prompt lengths (2, 7, 12 tokens), 16 new tokens each.
std::vector<inference::Request> three_requests(int64_t V, uint32_t seed) {
  std::vector<inference::Request> reqs;
  for (int i = 0; i < 3; ++i) {
    inference::Request r;
    r.prompt = make_prompt(2 + 5 * i, seed + static_cast<uint32_t>(i), V);
    r.max_new_tokens = 16;
    reqs.push_back(r);
  }
  return reqs;
}

// The engine's greedy tokens for `reqs` with the switch `env` (read when the runner is built) set
// to `on` equal those with it set to `off`, at batch 1 and 3, eager (unless graphs_only) and graphed.
void expect_same_tokens_with(const char* env, model::GPTModel& m, const std::vector<inference::Request>& reqs,
                             bool graphs_only, const std::string& what, const char* off = "0", const char* on = "1") {
  for (const bool graphs : {false, true}) {
    if (graphs_only && !graphs) continue;
    for (const int64_t batch : {int64_t{1}, int64_t{3}}) {
      inference::EngineOptions o;
      o.max_batch = batch;
      o.cuda_graphs = graphs;
      setenv(env, off, 1);
      const auto want = run_engine(m, reqs, o);
      setenv(env, on, 1);
      const auto got = run_engine(m, reqs, o);
      unsetenv(env);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(got[i].tokens, want[i].tokens)
            << what << " " << env << " graphs " << graphs << " batch " << batch << " request " << i;
    }
  }
}

// The engine with each switch on and off: the same greedy tokens, one request at a time and
// batched. MT_DECODE_FUSED (other kernels) eager and graphed; MT_DECODE_ARENA (the same kernels;
// only the buffers' addresses differ) where it applies, graphed.
TEST(DecodeKernelsGpu, EngineTokensEqualWithEachOptInSwitch) {
  MT_REQUIRE_GPU();
  for (const std::string& f : {std::string("llama"), std::string("qwen3"), std::string("gpt2")}) {
    model::TransformerConfig c = family_config(f);
    c.bf16 = true;
    model::GPTModel m(c);
    m.to_device(Device::CUDA);
    const std::vector<inference::Request> reqs = three_requests(c.orig_vocab_size, 90);
    expect_same_tokens_with("MT_DECODE_FUSED", m, reqs, false, f);
    expect_same_tokens_with("MT_DECODE_ARENA", m, reqs, true, f);
    setenv("MT_DECODE_FUSED", "1", 1);
    setenv("MT_DECODE_ARENA", "1", 1);
    inference::ModelRunner opted(m, 1, 32, true);
    setenv("MT_DECODE_FUSED", "0", 1);
    setenv("MT_DECODE_ARENA", "0", 1);
    inference::ModelRunner general(m, 1, 32, true);
    unsetenv("MT_DECODE_FUSED");
    unsetenv("MT_DECODE_ARENA");
    inference::ModelRunner dflt(m, 1, 32, true);
    EXPECT_TRUE(opted.decode_kernels());
    EXPECT_TRUE(opted.graph_arena());
    EXPECT_FALSE(general.decode_kernels());
    EXPECT_FALSE(general.graph_arena());
    EXPECT_TRUE(dflt.decode_kernels());  // the decode kernels and the arena are the defaults (session 16)
    EXPECT_TRUE(dflt.graph_arena());
  }
}

// The decode fusions (norm -> GEMV, GEMV -> SwiGLU, the QKV split into the cache; MT_DECODE_FUSIONS=0
// turns them off), the opt-in whole-stack decode kernel (MT_DECODE_STACK=1) and the two
// GEMV kernels (MT_GEMV_KERNEL=base|wide): the same greedy tokens, on
// the tiny family models (the fusions where their layers allow: no qk-norm split fusion for
// qwen3, no norm fusion for gpt2's LayerNorm) and on a llama of head dim 64, where the split's
// 16-byte kernel with RoPE and the decode attention kernel run as at llama-1.5b's shape. The
// fusions compute what the unfused ops store, bit for bit; the GEMV kernels differ in fp32
// summation order only (the tiny models' logits are far from ties).
TEST(DecodeKernelsGpu, EngineTokensEqualWithAndWithoutTheDecodeFusions) {
  MT_REQUIRE_GPU();
  for (const std::string& f : {std::string("llama"), std::string("qwen3"), std::string("gpt2"), std::string("llama64")}) {
    model::TransformerConfig c = family_config(f == "llama64" ? "llama" : f);
    if (f == "llama64") {  // head dim 64, 2 query heads per group, SwiGLU ffn
      c.hidden_size = 256;
      c.num_attention_heads = 4;
      c.num_query_groups = 2;
      c.ffn_hidden_size = 512;
      c.kv_channels = 0;
      c.init_method_std = 0.2f;
    }
    c.bf16 = true;
    model::GPTModel m(c);
    m.to_device(Device::CUDA);
    const std::vector<inference::Request> reqs = three_requests(c.orig_vocab_size, 91);
    expect_same_tokens_with("MT_DECODE_FUSIONS", m, reqs, false, f);
    expect_same_tokens_with("MT_GEMV_KERNEL", m, reqs, false, f, "base", "wide");
    // The whole-stack kernel (batch-1 steps, head dim 64: llama64 only), eager and graphed.
    const int64_t launches = stack_launches();
    expect_same_tokens_with("MT_DECODE_STACK", m, reqs, false, f);
    if (f == "llama64") {
      EXPECT_GT(stack_launches(), launches) << "the whole-stack kernel never ran";
    }
    unsetenv("MT_DECODE_FUSIONS");
    inference::ModelRunner dflt(m, 1, 32, true);
    EXPECT_TRUE(dflt.decode_fusions());  // on by default with the decode kernels
    EXPECT_FALSE(dflt.decode_stack());   // opt-in (MT_DECODE_STACK=1)
    setenv("MT_DECODE_FUSED", "0", 1);
    inference::ModelRunner general(m, 1, 32, true);
    unsetenv("MT_DECODE_FUSED");
    EXPECT_FALSE(general.decode_fusions());  // part of the decode kernels
  }
}

// ops::DeviceArena (the decode graphs' default): a capture served from an arena has no memory nodes, its
// tally is every request rounded to 256 bytes, and its replays give the eager result bit for bit
// (the same kernels on other addresses), also after the inputs change.
TEST(DecodeArenaGpu, CaptureWithoutMemoryNodesReplaysTheEagerResult) {
  MT_REQUIRE_GPU();
  Tensor x = to_gpu(random_bf16_values({64, 251}, 5));
  Tensor out = Tensor::zeros({64, 251}, DType::BF16, Device::CUDA);
  auto step = [&] {  // out = 4 x, through two temporaries
    Tensor t = Tensor::empty(x.shape(), x.dtype(), x.device());
    ops::copy_into(t, x);
    ops::add_inplace(t, x);
    Tensor u = Tensor::empty(x.shape(), x.dtype(), x.device());
    ops::copy_into(u, t);
    ops::add_inplace(u, t);
    ops::copy_into(out, u);
  };
  const int64_t bytes = ops::DeviceArena::tally(step);
  EXPECT_EQ(bytes, 2 * 32256);  // 64 x 251 x 2 = 32128 bytes, rounded up to 256
  const Tensor want = from_gpu(out);

  ops::StreamGraph pooled;
  pooled.capture(step);
  std::printf("[ graph census ] pooled: %s\n", pooled.census().c_str());
  ops::DeviceArena arena(bytes);
  ops::StreamGraph g;
  g.capture([&] { arena.serve(step); });
  const std::string census = g.census();
  std::printf("[ graph census ] arena: %s\n", census.c_str());
  EXPECT_EQ(census.find("mem-alloc"), std::string::npos) << census;
  EXPECT_EQ(census.find("mem-free"), std::string::npos) << census;
  EXPECT_EQ(arena.used(), bytes);
  EXPECT_EQ(arena.misses(), 0);

  ops::copy_into(out, Tensor::zeros(out.shape(), out.dtype(), Device::CUDA));
  g.launch();
  const Tensor got = from_gpu(out);
  EXPECT_EQ(0, std::memcmp(got.data<float>(), want.data<float>(), sizeof(float) * static_cast<size_t>(want.numel())));

  ops::copy_into(x, to_gpu(random_bf16_values({64, 251}, 6)));
  step();  // eager, into out
  const Tensor want2 = from_gpu(out);
  ops::copy_into(out, Tensor::zeros(out.shape(), out.dtype(), Device::CUDA));
  g.launch();
  const Tensor got2 = from_gpu(out);
  EXPECT_EQ(0, std::memcmp(got2.data<float>(), want2.data<float>(), sizeof(float) * static_cast<size_t>(want2.numel())));
}


}  // namespace
}  // namespace mt::test
