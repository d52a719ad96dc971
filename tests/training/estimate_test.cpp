// `megatron estimate` against what was measured (every BENCHMARKS.md row reporting a peak) and
// against per-rank sizing worked out by hand.
#include "training/estimate.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/config.h"
#include "model/gpt_model.h"
#include "support/tiny_models.h"
#include "training/estimate_args.h"

namespace mt::estimate {
namespace {

using namespace shapes;  // NOLINT(google-build-using-namespace): the shared shapes and run()

const Args kMoE2b = kLlama15 + Args{"--num-experts", "8", "--moe-ffn-hidden-size", "2048", "--moe-router-topk", "2",
                                    "--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
                                    "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"};
const Args kGpt2 = {"--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length",
                    "1024", "--max-position-embeddings", "1024", "--vocab-size", "50257", "--micro-batch-size", "16",
                    "--global-batch-size", "16"};
const Args kGpt2XL = {"--num-layers", "48", "--hidden-size", "1600", "--num-attention-heads", "25", "--seq-length",
                      "1024", "--max-position-embeddings", "1024", "--vocab-size", "50257", "--micro-batch-size", "8",
                      "--global-batch-size", "8"};
const Args kCpuBench = {"--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "8",
                        "--group-query-attention", "--num-query-groups", "4", "--ffn-hidden-size", "384",
                        "--seq-length", "128", "--max-position-embeddings", "128", "--normalization", "RMSNorm",
                        "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear",
                        "--untie-embeddings-and-output-weights", "--attention-dropout", "0.0", "--hidden-dropout",
                        "0.0", "--vocab-size", "50257", "--micro-batch-size", "8", "--global-batch-size", "16",
                        "--device", "cpu"};

void expect_within_10pct(double estimate_gib, double measured_gib, const char* row) {
  EXPECT_NEAR(estimate_gib, measured_gib, 0.10 * measured_gib) << row;
}

// ---- One GPU ---------------------------------------------------------------------------------

TEST(Estimate, Llama15bAllocatorPeak) {
  const Estimate e = run(kLlama15 + kGpu + Args{"--global-batch-size", "32"});
  // Session 9, #16 item 1 A/B (H100, d8fa4fc): "peak GPU memory" 36.44 GiB, moments in the pool.
  expect_within_10pct(logged_peak_gib(e, true), 36.44, "llama-1.5b, session 9, 36.44 GiB");
  // Sessions 5-8 (H100, 1a90fcf, a7d1f02, bdb7e59, ebf3033, 54eba57): 25.27 GiB without moments.
  expect_within_10pct(logged_peak_gib(e, false), 25.27, "llama-1.5b, sessions 5-8, 25.27 GiB");
  // Sessions 3-4 (H100 81ac09e / af21c27, H200 326a4ec / a55a506 / 01a0b19): 25.77 GiB.
  expect_within_10pct(logged_peak_gib(e, false), 25.77, "llama-1.5b, sessions 3-4, 25.77 GiB");
  // The moments: 8 bytes x 1.4985e9 parameters = 11.2 GiB, the difference session 9 names.
  EXPECT_NEAR(e.stages[0].optimizer / kGiB, 36.44 - 25.27, 0.05);
}

// cuDNN's deterministic attention backward takes a B*Hq*S*S*2-byte workspace outside the tensor
// peak line; at seq 32k (64 GiB) it ran an H100 out of memory under every recompute setting
// (session 12), so above a quarter of the card the flash kernels run the backward instead.
TEST(Estimate, CudnnAttentionWorkspaceAtLongSequences) {
  auto ws = [](const char* seq, const Args& extra) {
    return run(llama("16", "2048", "32", "8192", seq, "1") + kGpu + Args{"--global-batch-size", "1"} + extra)
               .attention_workspace /
           kGiB;
  };
  EXPECT_DOUBLE_EQ(ws("2048", {}), 0.25);  // 32 heads x 2048^2 x 2 bytes
  EXPECT_DOUBLE_EQ(ws("16384", {}), 16.0);
  EXPECT_EQ(ws("32768", {}), 0.0);  // 64 GiB > 20 GiB: the flash kernels, no workspace
  EXPECT_DOUBLE_EQ(ws("32768", {"--attention-backend", "fused"}), 64.0);  // fused insists (and fails by name)
  EXPECT_EQ(ws("16384", {"--attention-backend", "flash"}), 0.0);
  EXPECT_EQ(ws("16384", {"--nondeterministic-attention"}), 0.0);
  EXPECT_EQ(ws("16384", {"--attention-dropout", "0.1"}), 0.0);  // dropout runs the flash kernels
  // Seq 32k with full recompute then needs well under an 80 GB card.
  const Estimate full = run(llama("16", "2048", "32", "8192", "32768", "1") + kGpu +
                            Args{"--global-batch-size", "1", "--recompute-granularity", "full", "--recompute-method",
                                 "uniform", "--recompute-num-layers", "1"});
  EXPECT_LT(full.needed_bytes() / kGiB, 40.0);
}

TEST(Estimate, Gpt2Peaks) {
  const Estimate small = run(kGpt2 + kGpu);
  // gpt2-124m, H100: 7.28 GiB (1a90fcf .. ebf3033), 7.56 GiB (81ac09e, af21c27, H200 326a4ec).
  expect_within_10pct(logged_peak_gib(small, false), 7.28, "gpt2-124m, 7.28 GiB");
  expect_within_10pct(logged_peak_gib(small, false), 7.56, "gpt2-124m, 7.56 GiB");
  const Estimate xl = run(kGpt2XL + kGpu);
  // gpt2-1.5b, H100: 34.14 GiB (1a90fcf .. ebf3033), 35.31 GiB (81ac09e, af21c27).
  expect_within_10pct(logged_peak_gib(xl, false), 34.14, "gpt2-1.5b, 34.14 GiB");
  expect_within_10pct(logged_peak_gib(xl, false), 35.31, "gpt2-1.5b, 35.31 GiB");
}

TEST(Estimate, MoE2bPeak) {
  // moe-2b, H100, session 9: 48.96 GiB at 8 micro-batches per step (e760b19) and at 1 (6454e13),
  // moments in the pool. One micro-batch is in flight either way.
  for (const char* gbs : {"32", "4"}) {
    const Estimate e = run(kMoE2b + kGpu + Args{"--global-batch-size", gbs});
    expect_within_10pct(logged_peak_gib(e, true), 48.96, "moe-2b, session 9, 48.96 GiB");
  }
}

// ---- Two GPUs --------------------------------------------------------------------------------

TEST(Estimate, Llama15bDataParallel) {
  // 2x H200, a55a506: DP=2 with --overlap-grad-reduce, and with the distributed optimizer and
  // --overlap-param-gather: 25.77 GiB each (moments outside the pool then).
  const Args llama = kLlama15 + kGpu + Args{"--global-batch-size", "64", "--overlap-grad-reduce"};
  expect_within_10pct(logged_peak_gib(run(llama, 2), false), 25.77, "llama-1.5b-dp2-overlap, 25.77 GiB");
  const Estimate d = run(llama + Args{"--use-distributed-optimizer", "--overlap-param-gather"}, 2);
  expect_within_10pct(logged_peak_gib(d, false), 25.77, "llama-1.5b-dp2-distopt, 25.77 GiB");
  // The distributed optimizer halves the moments over DP 2, nothing else.
  const Estimate n = run(llama, 2);
  EXPECT_NEAR(d.stages[0].optimizer * 2, n.stages[0].optimizer, 1.0);
  EXPECT_DOUBLE_EQ(d.stages[0].grads, n.stages[0].grads);
}

TEST(Estimate, Llama15bPipeline) {
  // 2x H200, 7179572 and 81ac09e ("peak GiB" column, independent of M = 4, 8, 16).
  struct Row {
    Args flags;
    double measured;
    const char* row;
  };
  const Args pp2 = {"--pipeline-model-parallel-size", "2"};
  const Args balanced = {"--decoder-last-pipeline-num-layers", "6"};
  const Args vpp2 = {"--num-virtual-stages-per-pipeline-rank", "2"};
  const std::vector<Row> rows = {
      {pp2, 17.2, "even 8+8, 1F1B: 17.2 GiB"},
      {pp2 + vpp2, 19.8, "even 8+8, interleaved V=2: 19.8 GiB"},
      {pp2 + balanced, 20.8, "balanced 10+6, 1F1B: 20.8 GiB"},
      {pp2 + balanced + vpp2, 23.9, "balanced 10+6, interleaved V=2: 23.9 GiB"},
  };
  for (const Row& r : rows)
    for (const char* gbs : {"16", "32", "64"})
      expect_within_10pct(logged_peak_gib(run(kLlama15 + kGpu + r.flags + Args{"--global-batch-size", gbs}, 2), false),
                          r.measured, r.row);
}

TEST(Estimate, Llama8bTensorParallel) {
  // 2x H200, 21d0853 / 7179572 / 81ac09e: TP=2 + SP (with and without --tp-comm-overlap), 47.00 GiB.
  const Args tp2 = kLlama8 + kGpu + Args{"--global-batch-size", "8", "--tensor-model-parallel-size", "2",
                                         "--sequence-parallel"};
  expect_within_10pct(logged_peak_gib(run(tp2, 2), false), 47.00, "llama-8b-tp2-sp, 47.00 GiB");
  expect_within_10pct(logged_peak_gib(run(tp2 + Args{"--tp-comm-overlap"}, 2), false), 47.00,
                      "llama-8b-tp2-sp-overlap, 47.00 GiB");
}

TEST(Estimate, Llama8bPipeline) {
  // 2x H200, 81ac09e: PP=2 split 18+14, M=4 and M=8: 62.18 GiB; interleaved V=2, M=4: 67.31 GiB.
  const Args pp2 = kLlama8 + kGpu + Args{"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "14"};
  for (const char* gbs : {"4", "8"})
    expect_within_10pct(logged_peak_gib(run(pp2 + Args{"--global-batch-size", gbs}, 2), false), 62.18,
                        "llama-8b-pp2, 62.18 GiB");
  const Estimate v = run(pp2 + Args{"--global-batch-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"}, 2);
  expect_within_10pct(logged_peak_gib(v, false), 67.31, "llama-8b-pp2-vpp2-m4, 67.31 GiB");
  // The first stage holds the most (18 layers, PP - 0 = 2 micro-batches in flight); so rank 0's
  // log line is the job's peak.
  EXPECT_EQ(v.peak_stage().rank, 0);
}

// ---- CPU -------------------------------------------------------------------------------------

TEST(Estimate, CpuQuickstartShape) {
  // bench/cpu_train_bench.sh, peak_host_mem_mib: 704 (f7f2b29, AMD EPYC, CPU-only build); 831 and
  // 840 (54eba57), 856 and 867 (4bf63f0) on the GPU machine's Intel host, whose build links CUDA.
  Options cpu_only;
  cpu_only.cuda_build = false;
  const Estimate e = run(kCpuBench, 1, cpu_only);
  EXPECT_FALSE(e.gpu);
  const double mib = e.needed_bytes() / (1 << 20);
  EXPECT_NEAR(mib, 704, 70.4) << "cpu-quickstart-shape, f7f2b29, 704 MiB";
  Options cuda;
  cuda.cuda_build = true;
  const double with_cuda = run(kCpuBench, 1, cuda).needed_bytes() / (1 << 20);
  for (double measured : {831.0, 840.0, 856.0, 867.0}) EXPECT_NEAR(with_cuda, measured, 0.1 * measured);
}

TEST(Estimate, CpuLayersScale) {
  // BENCHMARKS.md, "megatron estimate: CPU calibration" (AMD EPYC, 2 cores, CPU-only build,
  // 4a5aa40): maximum resident memory of a hidden-256 model (seq 256, micro-batch 16, vocabulary
  // 1000) with 2, 6 and 12 layers, and of the quickstart shape, from /usr/bin/time -v.
  Options cpu_only;
  cpu_only.cuda_build = false;
  const Args shape = {"--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "256",
                      "--max-position-embeddings", "256", "--normalization", "RMSNorm", "--swiglu",
                      "--position-embedding-type", "rope", "--disable-bias-linear",
                      "--untie-embeddings-and-output-weights", "--ffn-hidden-size", "1024", "--vocab-size", "1000",
                      "--micro-batch-size", "16", "--global-batch-size", "16", "--attention-dropout", "0",
                      "--hidden-dropout", "0", "--device", "cpu"};
  for (auto [layers, mib] : {std::pair{"2", 301.8}, {"6", 753.8}, {"12", 1342.0}})
    EXPECT_NEAR(run(shape + Args{"--num-layers", layers}, 1, cpu_only).needed_bytes() / (1 << 20), mib, 0.1 * mib)
        << layers << " layers";
  EXPECT_NEAR(run(kCpuBench, 1, cpu_only).needed_bytes() / (1 << 20), 676.9, 67.7) << "quickstart shape";
}

// ---- Sizing by hand --------------------------------------------------------------------------

// Llama-3 70B at TP=8 x PP=4 with the distributed optimizer on 64 GPUs (DP = 64 / 32 = 2).
TEST(Estimate, Llama3_70bTp8Pp4ByHand) {
  // Llama-3 70B's vocabulary is 128256 (llama() gives the benchmarks' 128255; both pad to 129024 here).
  const Args l70 = llama("80", "8192", "64", "28672", "8192", "1") +
                   Args{"--global-batch-size", "128", "--bf16", "--tensor-model-parallel-size", "8",
                        "--pipeline-model-parallel-size", "4", "--sequence-parallel", "--use-distributed-optimizer",
                        "--recompute-activations"};
  const Estimate e = run(l70, 64);
  ASSERT_EQ(e.stages.size(), 4u);
  EXPECT_EQ(e.dp, 2);
  // Vocabulary: 128255 (or Llama-3's 128256) padded to a multiple of 128 x TP = 1024: 126 x 1024 = 129024.
  // One layer on one TP rank (80 layers / PP 4 = 20 per stage):
  //   linear_qkv  8192 x (8 groups x (8 q + 2 kv heads) x 128 = 10240) / 8 = 10,485,760
  //   linear_proj 8192 x 8192 / 8                                        =  8,388,608
  //   linear_fc1  8192 x (2 x 28672) / 8                                 = 58,720,256
  //   linear_fc2  28672 x 8192 / 8                                       = 29,360,128
  //   two RMSNorm weights, replicated: 2 x 8192                          =     16,384
  //                                                                 sum = 106,971,136
  const int64_t layer = 10485760 + 8388608 + 58720256 + 29360128 + 16384;
  ASSERT_EQ(layer, 106971136);
  const int64_t vocab_shard = 129024LL * 8192 / 8;  // 132,120,576 rows x hidden of the embedding / output
  // Stage 0: 20 layers + the embedding shard = 2,271,543,296; stage 3: 20 layers + the final
  // norm (8192) + the output layer shard = 2,271,551,488; stages 1, 2: 2,139,422,720.
  EXPECT_EQ(e.stages[0].params, 20 * layer + vocab_shard);
  EXPECT_EQ(e.stages[0].params, 2271543296LL);
  EXPECT_EQ(e.stages[1].params, 2139422720LL);
  EXPECT_EQ(e.stages[3].params, 20 * layer + 8192 + vocab_shard);
  // Bytes per parameter on a rank here: bf16 weights 2 + fp32 main params 4 + fp32 grads 4 +
  // Adam's two fp32 moments 8 / DP 2 = 4 -> 14. (Megatron-LM's distributed optimizer shards the
  // fp32 main params too: 6 + 12 / DP = 12 bytes; megatron.cpp keeps them whole on every rank.)
  const double n = 2271543296.0;
  EXPECT_DOUBLE_EQ(e.stages[0].weights, 2 * n);      // 4.23 GiB
  EXPECT_DOUBLE_EQ(e.stages[0].main_params, 4 * n);  // 8.46 GiB
  EXPECT_DOUBLE_EQ(e.stages[0].grads, 4 * n);        // 8.46 GiB
  EXPECT_DOUBLE_EQ(e.stages[0].optimizer, 4 * n);    // 8.46 GiB
  EXPECT_NEAR(e.stages[0].states() / kGiB, 14 * n / kGiB, 1e-9);  // 29.62 GiB
  EXPECT_NEAR(14 * n / kGiB, 29.62, 0.01);
  // 1F1B: stage s holds PP - s micro-batches in flight.
  for (int s = 0; s < 4; ++s) EXPECT_EQ(e.stages[static_cast<size_t>(s)].in_flight, 4 - s);
}

TEST(Estimate, ParametersAddUpToTheModel) {
  // One rank holding everything counts exactly TransformerConfig::num_parameters(): GPT-2 (tied,
  // biases, learned positions, LayerNorm), Llama, MoE with a gated shared expert, QK norms.
  for (const Args& argv : {kGpt2, kLlama15 + Args{"--global-batch-size", "4"},
                           kMoE2b + Args{"--global-batch-size", "4", "--moe-shared-expert-intermediate-size", "1024",
                                         "--moe-shared-expert-gate", "--qk-layernorm"}}) {
    const Arguments a = run_args(argv + Args{"--device", "cpu"}, 1);
    const Estimate e = estimate(a);
    EXPECT_EQ(e.stages[0].params, a.model.num_parameters());
  }
  // Split over TP 2 x PP 2 (tied: the last stage holds a copy of the embedding).
  const Arguments a = run_args(kGpt2 + Args{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                            "--device", "cpu", "--global-batch-size", "32"},
                               4);
  const Estimate e = estimate(a);
  const int64_t h = 768, V = a.model.vocab_size, norms_per_layer = 2 * 2 * h, proj_bias = h, fc2_bias = h;
  // Replicated per TP rank: norms and row-parallel biases (counted twice over 2 TP ranks).
  const int64_t replicated = 12 * (norms_per_layer + proj_bias + fc2_bias) + 2 * h /*final norm*/ +
                             1024 * h /*positions*/;
  EXPECT_EQ(2 * (e.stages[0].params + e.stages[1].params), a.model.num_parameters() + replicated + V * h);
}

TEST(Estimate, RecomputationShrinksActivations) {
  const Args base = kLlama15 + kGpu + Args{"--global-batch-size", "32"};
  const Estimate none = run(base);
  const Estimate sel = run(base + Args{"--recompute-activations"});
  const Estimate full = run(base + Args{"--recompute-granularity", "full", "--recompute-method", "uniform",
                                        "--recompute-num-layers", "1"});
  // Selective drops each layer's core output [tokens, heads x 64] bf16 and lse [B, heads, S] fp32.
  const double per_layer = 8192.0 * 2048 * 2 + 4.0 * 32 * 2048 * 4;
  EXPECT_NEAR(none.stages[0].activations - sel.stages[0].activations, 16 * per_layer, 1.0);
  // Full recomputation keeps one [tokens, hidden] bf16 input per layer: 16 x 32 MiB.
  EXPECT_NEAR(full.stages[0].activations, 16 * 8192.0 * 2048 * 2, 1.0);
}

TEST(Estimate, InterleavedInFlightFollowsMegatron) {
  // PP 2, V 2, M 4: rank 0 warms up (2 - 0 - 1) x 2 + (2 - 1) x 2 = 4 passes, then holds 5; rank 1 3.
  const Estimate e = run(kLlama15 + kGpu + Args{"--global-batch-size", "16", "--pipeline-model-parallel-size", "2",
                                                "--num-virtual-stages-per-pipeline-rank", "2"},
                         2);
  EXPECT_EQ(e.stages[0].in_flight, 5);
  EXPECT_EQ(e.stages[1].in_flight, 3);
}

TEST(Estimate, SuggestionsFit) {
  // llama-8b on one 80 GiB GPU does not fit (144 GB of states); on 8 GPUs some layout does.
  Arguments parsed = parse_pretrain_args(kLlama8 + kGpu + Args{"--global-batch-size", "8"}, "estimate", {});
  Options o;
  o.world_size = 8;
  const double budget = 80 * kGiB;
  EXPECT_GT(estimate(validated(parsed, o, 128255), o).needed_bytes(), budget);
  const std::vector<Suggestion> s = suggestions(parsed, o, 128255, budget);
  ASSERT_FALSE(s.empty());
  for (const Suggestion& x : s) {
    EXPECT_TRUE(x.fits) << x.change;
    EXPECT_LE(x.needed, budget) << x.change;
  }
}

TEST(Estimate, CommunicationVolumes) {
  // DP 2 all-reduce of fp32 grads: 2 x (2-1)/2 x 4 bytes x 1,498,482,688 parameters.
  const Estimate dp = run(kLlama15 + kGpu + Args{"--global-batch-size", "64"}, 2);
  ASSERT_EQ(dp.comm.size(), 1u);
  EXPECT_EQ(dp.comm[0].group, "DP");
  EXPECT_NEAR(dp.comm[0].bytes, 4.0 * static_cast<double>(dp.stages[0].params), 1.0);
  // TP 2 + SP, one micro-batch of 4096 tokens x 4096 hidden bf16 (32 MiB), 32 layers: 10 gathers
  // or scatters of (2-1)/2 x 32 MiB per layer, plus the embedding's 1 and the head's 3.
  const Estimate tp = run(kLlama8 + kGpu + Args{"--global-batch-size", "1", "--tensor-model-parallel-size", "2",
                                                "--sequence-parallel"},
                          2);
  const double act = 4096.0 * 4096 * 2;
  EXPECT_NEAR(tp.comm[0].bytes, (32 * 10 + 4) * act / 2, 1.0);
}

}  // namespace
}  // namespace mt::estimate

namespace mt::estimate {
namespace {

using namespace shapes;  // NOLINT(google-build-using-namespace)

// The per-layer model against the tensors a layer really keeps: a CPU forward of each shape,
// TransformerLayer::saved_bytes of every layer (fp32 on the CPU, as the estimate's CPU bytes).
TEST(Estimate, LayerBytesMatchWhatLayersSave) {
  const Args tiny = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "32",
                     "--micro-batch-size", "2", "--vocab-size", "100", "--device", "cpu"};
  const Args llama = {"--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                      "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
                      "--untie-embeddings-and-output-weights"};
  const Args moe = {"--num-experts", "4", "--moe-ffn-hidden-size", "48", "--moe-router-topk", "2",
                    "--moe-token-dispatcher-type", "alltoall"};
  for (const Args& extra : std::vector<Args>{{}, llama, llama + Args{"--qk-layernorm"}, llama + Args{"--recompute-activations"},
                                             Args{"--attention-dropout", "0.1", "--hidden-dropout", "0.1"}, llama + moe,
                                             llama + moe + Args{"--recompute-activations", "--recompute-modules", "moe_act"},
                                             llama + moe + Args{"--recompute-activations", "--recompute-modules", "moe"}}) {
    const Arguments a = run_args(tiny + extra, 1);
    model::GPTModel m(a.model);
    model::PassContext ctx;
    RngState rng{1, 0};
    ctx.rng = &rng;
    model::GPTModel::Saved s;
    m.forward(test::random_batch(a.micro_batch_size, a.model.seq_length, 100, 3), s, ctx);
    for (size_t l = 0; l < s.layers.size(); ++l)
      EXPECT_EQ(layer_activation_bytes(a, static_cast<int64_t>(l), false),
                static_cast<double>(model::TransformerLayer::saved_bytes(s.layers[l])))
          << "layer " << l << " with" << [&] {
               std::string f;
               for (const auto& x : extra) f += " " + x;
               return f;
             }();
  }
}

}  // namespace
}  // namespace mt::estimate
