// FP8's part of `megatron estimate` (training/estimate_fp8.h): its terms worked out by hand for a
// tiny shape, against what the real-GEMM path keeps (its CPU reference), and against the FP8
// peaks measured in BENCHMARKS.md.
#include "training/estimate_fp8.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/philox.h"
#include "model/gpt_model.h"
#include "support/tiny_models.h"
#include "training/estimate.h"
#include "training/estimate_args.h"

namespace mt::estimate {
namespace {

using namespace shapes;  // NOLINT(google-build-using-namespace): the shared shapes and run()

// 4 layers, hidden 256, 4 heads of 64 in 2 query groups, SwiGLU ffn 512, seq 128, micro-batch 2
// (R = 256 rows per GEMM), one GPU, one micro-batch per step. Per layer, weights [out, in]:
//   linear_qkv  [2 groups x (2 q + 2 kv) x 64 = 512, 256] = 131,072
//   linear_proj [256, 256]                                 =  65,536
//   linear_fc1  [1024, 256]                                = 262,144
//   linear_fc2  [256, 512]                                 = 131,072   sum 589,824
// Every dimension is a multiple of 16 and 128: the real cuBLASLt path for every recipe.
const Args kTiny = {"--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
                    "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "512",
                    "--seq-length", "128", "--max-position-embeddings", "128", "--normalization", "RMSNorm",
                    "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
                    "--untie-embeddings-and-output-weights", "--vocab-size", "1000", "--micro-batch-size", "2",
                    "--global-batch-size", "2"};
const Args kTensorwise = {"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"};

Fp8LayerBytes tiny_layer(const Args& fp8, int64_t layer = 1) {
  return fp8_layer_bytes(run_args(kTiny + kGpu + fp8, 1), layer, true, false, true);
}

TEST(EstimateFp8, TensorwiseByHand) {
  const Fp8LayerBytes f = tiny_layer(kTensorwise);
  // weight_codes: 1 byte a weight, cached for the step.
  EXPECT_EQ(f.weight_codes, 589824.0);
  EXPECT_EQ(f.emulated_weights, 0.0);
  // Per linear: 3 states x (history 1 x 4 + scale 4 + amax 4 + clipped count 8) = 60, plus the
  // weight codes' scale and inverse 8 = 68; linear_proj, whose input attention keeps, re-casts
  // it in the backward: + recast scratch (amax 4, count 8) = 80. 68 x 3 + 80 = 284.
  EXPECT_EQ(f.state, 284.0);
  // Without TP the inputs of linear_qkv [256 x 256], linear_fc1 [256 x 256] and linear_fc2
  // [256 x 512] are kept as transposed codes: 65,536 + 65,536 + 131,072 = 262,144 bytes, in
  // place of their bf16 copies: 2 x (65,536 + 65,536 + 131,072) = 524,288.
  EXPECT_EQ(f.input_codes, 262144.0);
  EXPECT_EQ(f.inputs_dropped, 524288.0);
  EXPECT_EQ(f.pass_scales, 4 * 8.0);  // each linear's {scale, scale_inv} per forward
  // The backward's most: linear_fc1's dy codes [256 x 1024] and their transpose, 2 x 262,144,
  // plus w^T's codes [256 x 1024] 262,144 = 786,432 (linear_qkv's: 3 x 131,072).
  EXPECT_EQ(f.backward, 786432.0);
}

TEST(EstimateFp8, BlockwiseAddsTileScales) {
  const Fp8LayerBytes f = tiny_layer({"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"});
  // 128x128 weight tiles' f32 scale_invs, [ceil(out/128)][ceil(in/128) rounded up to 4]:
  // qkv 4 x 4, proj 2 x 4, fc1 8 x 4, fc2 2 x 4 = 64 scales = 256 bytes.
  EXPECT_EQ(f.weight_codes, 589824.0 + 256);
  // Codes of x^T [in, R] in 1x128 tiles along R: in x 2 scales each: (256 + 256 + 512) x 2 x 4.
  EXPECT_EQ(f.input_codes, 262144.0 + 8192);
  EXPECT_EQ(f.inputs_dropped, 524288.0);
  EXPECT_EQ(f.state, 4 * 60.0);   // no per-tensor scale pairs: the scales live with the codes
  EXPECT_EQ(f.pass_scales, 0.0);  // nor per forward
  // linear_fc1: dy [256 x 1024] (8 tiles a row: 256 x 8 x 4 = 8,192 bytes of scales), dy^T
  // [1024 x 256] (2 tiles a row: 8,192), w^T [256 x 1024] (2 x 8 blocks: 64 bytes).
  EXPECT_EQ(f.backward, 786432.0 + 8192 + 8192 + 64);
}

TEST(EstimateFp8, DelayedScalingHistoryAndSwigluCodes) {
  const Fp8LayerBytes f = tiny_layer({"--fp8-format", "hybrid", "--fp8-amax-history-len", "1024"});
  // The histories: 3 states x 1024 x 4 bytes more per linear than with a history of 1.
  EXPECT_EQ(f.state, 284.0 + 4 * 3 * 1023 * 4.0);
  // SwiGLU's backward writes linear_fc1's dy codes itself: no bf16 dh [256 x 1024] (524,288),
  // so linear_qkv's backward (3 x 131,072) is the largest.
  EXPECT_EQ(f.backward, 393216.0);
}

TEST(EstimateFp8, SequenceParallelKeepsOnlyFc2Codes) {
  // TP 2 + SP: the column-parallel inputs are gathered again in the backward (no codes kept;
  // bf16 shards saved as before); linear_fc2's input [256 x 256 per rank] is kept as codes.
  const Arguments a = run_args(kTiny + kGpu + kTensorwise +
                                   Args{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
                               2);
  const Fp8LayerBytes f = fp8_layer_bytes(a, 1, true, false, true);
  EXPECT_EQ(f.weight_codes, 589824.0 / 2);
  EXPECT_EQ(f.input_codes, 65536.0);
  EXPECT_EQ(f.inputs_dropped, 131072.0);
  // qkv and fc1 re-cast their inputs too now: 3 linears with the recast scratch.
  EXPECT_EQ(f.state, 68.0 + 3 * 80);
}

TEST(EstimateFp8, FirstLastLayersStayBf16) {
  const Args flags = kTensorwise + Args{"--first-last-layers-bf16"};
  EXPECT_EQ(tiny_layer(flags, 0).weight_codes, 0.0);
  EXPECT_EQ(tiny_layer(flags, 3).weight_codes, 0.0);
  EXPECT_EQ(tiny_layer(flags, 1).weight_codes, 589824.0);
  const Estimate e = run(kTiny + kGpu + flags);
  EXPECT_EQ(e.stages[0].fp8_weights, 2 * 589824.0);  // layers 2 and 3 of 4
}

TEST(EstimateFp8, ParamGatherHoldsTheSameCodes) {
  const Args dp2 = {"--global-batch-size", "4", "--use-distributed-optimizer"};
  const Fp8LayerBytes plain = fp8_layer_bytes(run_args(kTiny + kGpu + kTensorwise + dp2, 2), 1, true, false, true);
  const Fp8LayerBytes gathered = fp8_layer_bytes(
      run_args(kTiny + kGpu + kTensorwise + dp2 + Args{"--fp8-param-gather"}, 2), 1, true, false, true);
  EXPECT_EQ(gathered.weight_codes, plain.weight_codes);  // the bucket's bytes instead of the cache's
  EXPECT_EQ(gathered.state, plain.state + 4 * 4);      // each weight's amax in its bucket
}

// On the stage: the per-pass terms times the passes in flight; the report names each term.
TEST(EstimateFp8, StageAddsOnlyTheNamedTerms) {
  const Estimate bf16 = run(kTiny + kGpu);
  const Estimate fp8 = run(kTiny + kGpu + kTensorwise);
  const StageMemory &b = bf16.stages[0], &f = fp8.stages[0];
  EXPECT_EQ(f.fp8_weights, 4 * 589824.0);
  EXPECT_EQ(f.fp8_state, 4 * 284.0);
  EXPECT_EQ(f.fp8_input_codes, 4 * (262144.0 + 32));  // one pass in flight
  EXPECT_EQ(f.fp8_inputs_dropped, 4 * 524288.0);
  EXPECT_EQ(f.activations, b.activations + f.fp8_input_codes - f.fp8_inputs_dropped);
  // The layer backward (bf16: 2 x R x h x 2 + R x 512 x 3 x 2 = 1 MiB) less the head's kept
  // logits and norm tensors (786,432) was the peak's workspace: FP8 adds linear_fc1's 786,432.
  EXPECT_EQ(b.workspace, 262144.0);
  EXPECT_EQ(f.fp8_backward, 786432.0);
  EXPECT_EQ(f.workspace, b.workspace + f.fp8_backward);
  EXPECT_EQ(f.pool_peak(), b.pool_peak() + f.fp8_persistent() + f.activations - b.activations + f.fp8_backward);
  EXPECT_EQ(fp8.fp8_gemm_workspace, 32.0 * (1 << 20));
  EXPECT_NEAR(fp8.needed_bytes() - bf16.needed_bytes(),
              (f.pool_peak() - b.pool_peak()) * (1 + fp8.slack_fraction) + fp8.fp8_gemm_workspace, 1.0);
  const std::string r = report(run_args(kTiny + kGpu + kTensorwise, 1), fp8, Options{}, {});
  for (const char* row : {"fp8: hybrid (E4M3 forward, E5M2 gradients), tensorwise scaling, layers 1-4 of 4",
                          "FP8 weight codes (per step)", "FP8 scaling state (MiB)",
                          "  FP8 input codes (x^T)", "  bf16 inputs not kept", "  of which FP8 casts",
                          "+ cuBLASLt FP8 workspace"})
    EXPECT_NE(r.find(row), std::string::npos) << row << "\n" << r;
}

// The model against the code: the real-GEMM path's CPU reference (Fp8Store::real_gemms_on_cpu)
// runs a training forward, whose layers' Saved and FP8 saved entries (x^T codes, scales) must be
// the estimate's per-pass bytes, then the backward, after which the linears hold the weight bytes
// and scaling state the estimate names. Activations are fp32 on the CPU (4 bytes an element).
TEST(EstimateFp8, MatchesWhatTheRealPathKeeps) {
  const Args llama = {"--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                      "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
                      "--untie-embeddings-and-output-weights", "--num-layers", "2", "--num-attention-heads", "8",
                      "--micro-batch-size", "2", "--vocab-size", "100", "--device", "cpu", "--bf16"};
  // Hidden 64, seq 32: 64 rows, every dimension a multiple of 16. Hidden 128, seq 64: 128 rows;
  // linear_qkv's 192 outputs are no multiple of 128, so under blockwise it runs emulated.
  const Args small = {"--hidden-size", "64", "--seq-length", "32", "--max-position-embeddings", "32"};
  const Args wide = {"--hidden-size", "128", "--seq-length", "64", "--max-position-embeddings", "64"};
  const std::vector<Args> cases = {
      small + kTensorwise,
      small + Args{"--fp8-format", "hybrid", "--fp8-amax-history-len", "4"},
      small + kTensorwise + Args{"--no-fp8-wgrad"},
      wide + Args{"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"},
  };
  for (const Args& c : cases) {
    const Arguments a = run_args(llama + c, 1);
    const bool blockwise = a.model.fp8.recipe == model::Fp8Recipe::Blockwise;
    model::GPTModel m(a.model);
    m.fp8()->real_gemms_on_cpu = true;
    model::PassContext ctx;
    RngState rng{1, 0};
    ctx.rng = &rng;
    model::GPTModel::Saved s;
    const auto r = m.forward(test::random_batch(a.micro_batch_size, a.model.seq_length, 100, 3), s, ctx);
    auto bytes = [](const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; };
    auto of_layer = [](const model::Fp8LinearState& l, size_t i) {
      return l.name.starts_with("decoder.layers." + std::to_string(i) + ".");
    };
    std::string flags;
    for (const std::string& f : c) flags += " " + f;
    for (size_t i = 0; i < s.layers.size(); ++i) {
      double entries = 0;
      for (const model::Fp8LinearState& l : m.fp8()->linears())
        if (of_layer(l, i))
          for (const model::Fp8Saved& e : l.saved)
            entries += bytes(e.scale) + bytes(e.scale_inv) + bytes(e.x_t) + bytes(e.x_t_scale_inv);
      for (const model::Fp8LinearState& l : m.fp8()->linears())
        if (of_layer(l, i)) entries += 4.0 * static_cast<double>(l.pending_input_scales.size());
      const Fp8LayerBytes f = fp8_layer_bytes(a, static_cast<int64_t>(i), false, false, true);
      EXPECT_EQ(static_cast<double>(model::TransformerLayer::saved_bytes(s.layers[i])) + entries,
                layer_activation_bytes(a, static_cast<int64_t>(i), false) + f.codes_for_inputs() + f.pass_scales)
          << "layer " << i << flags;
    }
    m.params().zero_grad();
    m.backward(s, static_cast<float>(1.0 / r.tokens), ctx);
    for (size_t i = 0; i < s.layers.size(); ++i) {
      double weights = 0, state = 0;
      for (const model::Fp8LinearState& l : m.fp8()->linears()) {
        if (!of_layer(l, i)) continue;
        weights += bytes(l.weight_codes) + bytes(l.weight_q) + (blockwise ? bytes(l.weight_scale_inv) : 0.0);
        for (const model::Fp8TensorState* t : {&l.input, &l.weight, &l.grad})
          state += bytes(t->history) + bytes(t->scale) + bytes(t->amax) + bytes(t->saturated);
        state += bytes(l.weight_scale) + bytes(l.recast_amax) + bytes(l.recast_saturated) +
                 (blockwise ? 0.0 : bytes(l.weight_scale_inv));
      }
      const Fp8LayerBytes f = fp8_layer_bytes(a, static_cast<int64_t>(i), false, false, true);
      EXPECT_EQ(weights, f.weight_codes + f.emulated_weights) << "layer " << i << flags;
      EXPECT_EQ(state, f.state) << "layer " << i << flags;
    }
  }
}

// Every FP8 peak in BENCHMARKS.md (docs/estimate_fp8.md has the table, before and after): the
// pool peak of rank 0 against the trainer's "peak GPU memory" line. Within 0.5 GiB, as the bf16
// estimates of the same layouts; CP=2 x TP=2 at 32k within 2 GiB, where bf16's estimate is
// 1.75 GiB over already (its ring attention is modelled, not what runs).
TEST(EstimateFp8, MeasuredPeaks) {
  struct Row {
    Args flags;
    int64_t world;
    double measured, tolerance;
    const char* row;
  };
  const Args distopt = {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"};
  const Args l8 = kLlama8 + kGpu + kTensorwise + Args{"--tensor-model-parallel-size", "2", "--sequence-parallel"};
  const Args l15 = kLlama15 + kGpu + Args{"--global-batch-size", "32"};
  const Args l15dp = kLlama15 + kGpu + kTensorwise +
                     Args{"--global-batch-size", "64", "--use-distributed-optimizer", "--overlap-grad-reduce"};
  const std::vector<Row> rows = {
      // 4x H200, 9c673c8 (session 15, #24 item 2): llama-8b, 2 samples per GPU per step.
      {kLlama8 + kGpu + kTensorwise + distopt +
           Args{"--global-batch-size", "8", "--tensor-model-parallel-size", "4", "--sequence-parallel"},
       4, 39.44, 0.5, "llama-8b TP=4+SP FP8, 39.44 GiB"},
      {l8 + distopt + Args{"--global-batch-size", "8"}, 4, 63.84, 0.5, "llama-8b TP=2+SP x DP=2 FP8, 63.84 GiB"},
      {l8 + distopt + Args{"--global-batch-size", "8", "--pipeline-model-parallel-size", "2"}, 4, 43.33, 0.5,
       "llama-8b TP=2+SP x PP=2 FP8, 43.33 GiB"},
      {l8 + distopt +
           Args{"--global-batch-size", "2", "--context-parallel-size", "2", "--seq-length", "32768",
                "--max-position-embeddings", "32768", "--recompute-granularity", "full", "--recompute-method",
                "uniform", "--recompute-num-layers", "1"},
       4, 60.02, 2.0, "llama-8b CP=2 x TP=2+SP seq 32k FP8, 60.02 GiB"},
      // 2x H200, session 13: llama-8b TP=2+SP (no distributed optimizer), 78.80 GiB.
      {l8 + Args{"--global-batch-size", "8"}, 2, 78.80, 0.5, "llama-8b TP=2+SP FP8 on 2 GPUs, 78.80 GiB"},
      // One GPU, llama-1.5b at 8 micro-batches of 4: tensorwise 35.84 (H100 8ac79d4, H200
      // session 13, session 12), blockwise 35.89 (H200, session 13), delayed 35.85 (session 12).
      {l15 + kTensorwise, 1, 35.84, 0.5, "llama-1.5b tensorwise, 35.84 GiB"},
      {l15 + Args{"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"}, 1, 35.89, 0.5,
       "llama-1.5b blockwise, 35.89 GiB"},
      {l15 + Args{"--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"}, 1,
       35.85, 0.5, "llama-1.5b delayed, 35.85 GiB"},
      // 2x H200, 847dbc6 (session 13): DP=2 with the distributed optimizer, and the FP8 param gather.
      {l15dp, 2, 30.26, 0.5, "llama-1.5b DP=2 dist-opt tensorwise, 30.26 GiB"},
      {l15dp + Args{"--fp8-param-gather"}, 2, 30.26, 0.5, "llama-1.5b DP=2 dist-opt --fp8-param-gather, 30.26 GiB"},
  };
  for (const Row& r : rows) EXPECT_NEAR(logged_peak_gib(run(r.flags, r.world), true), r.measured, r.tolerance) << r.row;
}

// Without --fp8-format nothing changes: every FP8 term is zero, the pool peak is the sum it was
// before FP8 had terms, and the report prints no FP8 row.
TEST(EstimateFp8, NoFp8NoTerms) {
  const Args tp2 = {"--global-batch-size", "8", "--tensor-model-parallel-size", "2", "--sequence-parallel"};
  for (const auto& [argv, world] : {std::pair{kTiny + kGpu, 1}, {kLlama8 + kGpu + tp2, 2},
                                    {kTiny + Args{"--device", "cpu"}, 1}}) {
    const Arguments a = run_args(argv, world);
    const Estimate e = estimate(a);
    for (const StageMemory& s : e.stages) {
      EXPECT_EQ(s.fp8_persistent() + s.fp8_input_codes + s.fp8_inputs_dropped + s.fp8_backward, 0.0);
      EXPECT_EQ(s.pool_peak(), s.states() + s.activations + s.logits + s.workspace);
    }
    EXPECT_EQ(e.fp8_gemm_workspace, 0.0);
    EXPECT_EQ(report(a, e, Options{}, {}).find("FP8"), std::string::npos);
  }
}

}  // namespace
}  // namespace mt::estimate
