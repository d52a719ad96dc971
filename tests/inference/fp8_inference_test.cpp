// FP8-weight inference on the CPU (model/fp8_inference.h): the emulated linear equals an explicit
// reference (weights and inputs rounded through E4M3 with their own per-tensor scales, an fp32
// GEMM of the dequantised values); the real-GEMM path (1-byte codes, rows padded to 16) agrees
// with it; and on an FP8-trained fixture, FP8 generation's logits are close to the unquantised
// model's and its greedy tokens mostly agree.
#include <gtest/gtest.h>

#include <cmath>

#include "core/fp8.h"
#include "engine_support.h"
#include "fp8_fixture.h"
#include "kernels/ops.h"
#include "model/fp8_inference.h"
#include "support/error_of.h"

namespace mt::test {
namespace {

// A bias-free Llama-shaped model (every dimension a multiple of 16) and a GPT-2 one (biases,
// LayerNorm, GeLU), with FP8 for inference: E4M3, current scaling.
model::TransformerConfig fp8_config(const std::string& family) {
  model::TransformerConfig c = family_config(family);
  c.fp8.enabled = true;
  c.fp8.recipe = model::Fp8Recipe::Tensorwise;
  return c;
}

Tensor lcg_tensor(const Shape& shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(shape);
  uint32_t x = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    t.data<float>()[i] = scale * (static_cast<float>((x >> 8) % 20001) / 10000.f - 1.f);
  }
  return t;
}

// v rounded through E4M3 with the per-tensor current scale 448 / amax, read back (written from
// the OCP format's definition in core/fp8.h, not through the ops under test).
Tensor reference_quantize(const Tensor& v) {
  float amax = 0;
  for (int64_t i = 0; i < v.numel(); ++i) amax = std::max(amax, std::fabs(v.data<float>()[i]));
  const float s = fp8_max(Fp8Format::E4M3) / amax, inv = 1.f / s;
  Tensor q = Tensor::empty(v.shape());
  for (int64_t i = 0; i < v.numel(); ++i)
    q.data<float>()[i] = fp8_decode(fp8_encode(v.data<float>()[i] * s, Fp8Format::E4M3), Fp8Format::E4M3) * inv;
  return q;
}

std::vector<const model::Linear*> layer_linears(const model::GPTModel& m) {
  std::vector<const model::Linear*> v;
  for (const auto& l : m.layers()) v.insert(v.end(), {&l.attn.qkv, &l.attn.proj, &l.mlp.fc1, &l.mlp.fc2});
  return v;
}

// Every transformer linear of both families, at several row counts: the frozen FP8 forward is,
// bit for bit, the fp32 linear of the reference-quantised input and weight (plus the bias).
TEST(Fp8Inference, EmulatedLinearEqualsExplicitReference) {
  for (const std::string f : {"llama", "gpt2"}) {
    model::GPTModel m(fp8_config(f));
    std::vector<Tensor> weights;
    for (const model::Linear* lin : layer_linears(m)) weights.push_back(lin->weight->value.clone());
    const model::Fp8WeightMemory mem = model::freeze_fp8_weights(m);
    EXPECT_EQ(mem.linears, 8);
    EXPECT_EQ(mem.code_params, 0);  // the CPU emulates
    size_t i = 0;
    for (const model::Linear* lin : layer_linears(m)) {
      const Tensor wq = reference_quantize(weights[i++]);
      for (int64_t rows : {1, 5, 16, 23}) {
        const Tensor x = lcg_tensor({rows, lin->in}, static_cast<uint32_t>(rows * 31 + i), 3.f);
        model::PassContext ctx;
        ctx.training = false;
        const Tensor got = lin->forward(x, ctx);
        const Tensor want = ops::linear_forward(reference_quantize(x), wq, lin->bias ? &lin->bias->value : nullptr);
        ASSERT_EQ(got.shape(), want.shape());
        EXPECT_EQ(0, std::memcmp(got.data<float>(), want.data<float>(), static_cast<size_t>(got.numel()) * 4))
            << f << " " << lin->weight->name << " rows " << rows;
      }
    }
  }
}

// The GPU's path run on the CPU (Fp8Store::real_gemms_on_cpu: the same ops, their CPU
// references): weights as 1-byte codes, any row count padded to a multiple of 16, the bias and a
// fused residual added. It equals the emulation up to the order of fp32 sums.
TEST(Fp8Inference, CodesPathWithPaddedRowsMatchesTheEmulation) {
  for (const std::string f : {"llama", "gpt2"}) {
    model::GPTModel emu(fp8_config(f)), real(fp8_config(f));  // the same init (seeded by name)
    real.fp8()->real_gemms_on_cpu = true;
    model::freeze_fp8_weights(emu);
    const model::Fp8WeightMemory mem = model::freeze_fp8_weights(real);
    EXPECT_EQ(mem.code_params, mem.fp8_params);
    const auto le = layer_linears(emu), lr = layer_linears(real);
    for (size_t i = 0; i < le.size(); ++i)
      for (int64_t rows : {1, 3, 16, 17, 40}) {
        const Tensor x = lcg_tensor({rows, le[i]->in}, static_cast<uint32_t>(rows + 7 * i), 2.f);
        const Tensor res = lcg_tensor({rows, le[i]->out}, static_cast<uint32_t>(rows + 99), 1.f);
        const bool fuse = le[i]->fuses_residual();
        model::PassContext ctx;
        ctx.training = false;
        const Tensor want = le[i]->forward(x, ctx, fuse ? &res : nullptr);
        const Tensor got = lr[i]->forward(x, ctx, fuse ? &res : nullptr);
        ASSERT_EQ(got.shape(), want.shape()) << f << " rows " << rows;
        EXPECT_LT(relative_l2(got, want), 1e-6) << f << " " << le[i]->weight->name << " rows " << rows;
      }
  }
}

// The fixture (trained in FP8) loaded with and without --fp8-format: FP8 weights use a byte per
// weight, their logits over the pattern's prompts stay within 10% (relative L2) of the
// unquantised model's, and the greedy tokens FP8 picks along the unquantised model's own
// continuations agree at >= 90% of positions.
TEST(Fp8Inference, TrainedModelLogitsAndGreedyTokensTrackTheUnquantisedModel) {
  const std::string dir = fp8_trained_checkpoint();
  InferenceModel ref = load_inference_model(dir, -1, Device::CPU, false);
  InferenceModel q = load_inference_model(dir, -1, Device::CPU, false, nullptr, true);
  ASSERT_TRUE(q.model->fp8());
  EXPECT_FALSE(ref.model->fp8());
  for (const model::Fp8LinearState& l : q.model->fp8()->linears())
    EXPECT_EQ(l.weight_epoch, model::kFp8FrozenEpoch) << l.name;
  const int64_t V = ref.model->config().orig_vocab_size, n_new = 8;
  int64_t agree = 0, total = 0;
  double worst = 0;
  for (const std::vector<int32_t>& prompt : pattern_prompts()) {
    std::vector<int32_t> seq = prompt;
    const std::vector<int32_t> cont = reference_greedy(*ref.model, prompt, n_new);
    seq.insert(seq.end(), cont.begin(), cont.end());
    const Tensor lr = prefill_logits(*ref.model, seq), lq = prefill_logits(*q.model, seq);
    worst = std::max(worst, relative_l2(lq, lr));
    for (size_t p = prompt.size() - 1; p + 1 < seq.size(); ++p) {
      const float* row = lq.data<float>() + static_cast<int64_t>(p) * V;
      agree += std::max_element(row, row + V) - row == seq[p + 1];
      ++total;
    }
  }
  EXPECT_LT(worst, 0.10);
  EXPECT_GE(agree * 10, total * 9) << agree << " of " << total;
  std::printf("[ fp8 infer ] logits relative L2 %.4f (worst prompt); greedy agreement %lld/%lld\n", worst,
              static_cast<long long>(agree), static_cast<long long>(total));
}

// The engine with FP8 weights: batched generation equals one prompt at a time (the activations'
// scales are per pass, so a batch's rows could differ from a lone prompt's only through them:
// the same tokens show the scale's effect stays below the margins of a trained model).
TEST(Fp8Inference, EngineGreedyBatchedMatchesOneAtATime) {
  InferenceModel q = load_inference_model(fp8_trained_checkpoint(), -1, Device::CPU, false, nullptr, true);
  std::vector<inference::Request> reqs;
  for (const auto& p : pattern_prompts()) {
    inference::Request r;
    r.prompt = p;
    r.max_new_tokens = 6;
    reqs.push_back(r);
  }
  inference::EngineOptions o;
  o.max_batch = 4;
  const auto batched = run_engine(*q.model, reqs, o);
  o.max_batch = 1;
  const auto single = run_engine(*q.model, reqs, o);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(batched[i].tokens, single[i].tokens) << "prompt " << i;
}

TEST(Fp8Inference, RefusesAModelBuiltWithoutFp8) {
  model::GPTModel m(family_config("llama"));
  EXPECT_NE(error_of([&] { model::freeze_fp8_weights(m); }).find("--fp8-format"), std::string::npos);
}

}  // namespace
}  // namespace mt::test
