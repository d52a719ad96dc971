// The generation engine's speed on one GPU (bench/gpu_generate_bench.sh runs it): the llama-1.5b
// shape (Llama-3.2-1B with an untied head), random bf16 weights. Prints JSON lines:
//   copy_bandwidth   device-to-device cudaMemcpy, measured here (read + write bytes per second)
//   decode_batch1    decode tokens/s at batch 1, and the HBM bound: (weight bytes + KV cache bytes
//                    read per token) / the measured copy bandwidth; eager, graphed with the
//                    linears on cuBLASLt, graphed on the small-row GEMV (the engine's default);
//                    graphed lines add graph_gpu_ms_per_token (the decode graph replayed 200
//                    times back to back after the run: GPU time alone), host_gap_ms_per_token
//                    (ms_per_token minus that) and gpu_fraction_of_bound (the GPU time's fraction)
//   decode_batch64   generated tokens/s with 64 requests decoding together
//   ttft_2048        time to first token of a 2,048-token prompt (prefill + one sample)
// Options: --prompt N (decode benches' prompt, default 128), --new N (tokens generated, 256),
// --batch N (default 64), --ttft-prompt N (2048; 0 skips it), --layers N (16; fewer for a quick check),
// --fp8 1 (the transformer layers' linears with FP8 weights quantised at load, as generate
// --fp8-format e4m3: model/fp8_inference.h), --graphs-only 1 (skip the eager decode runs).
// Every line says "fp8": true or false. The graphed decode runs are measured with the engine's
// defaults ("path": "default": the decode kernels, their fusions, the Wide GEMV) and with each
// A/B variant, a switch set here per engine (inference/model_runner.cpp reads them when the
// engine is built): "general" (MT_DECODE_FUSED=0: the general kernels, no fusions),
// "default-fusions" (MT_DECODE_FUSIONS=0: the decode kernels without the norm/SwiGLU/KV-write
// fusions), "default+gemv-base" (MT_GEMV_KERNEL=base: session 16's first GEMV kernel) and
// "default-arena" (MT_DECODE_ARENA=0: the graphs' temporaries from the pool, as memory nodes),
// "default+stack" (MT_DECODE_STACK=1: the whole-stack kernel, one kernel for every layer);
// each variant's generated tokens are compared with the default run's ("same_tokens": greedy
// ties on a random model may break differently under another summation order).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "inference/engine.h"
#include "inference/model_runner.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"
#include "model/fp8_inference.h"
#include "model/gpt_model.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Read + write bytes per second of a 1 GiB device-to-device copy (the best of 10).
double copy_bandwidth() {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, n), "cudaMalloc");
  check(cudaMalloc(&b, n), "cudaMalloc");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  check(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice), "warm-up copy");
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    check(cudaEventRecord(e0), "record");
    check(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice), "copy");
    check(cudaEventRecord(e1), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(n) / (best * 1e-3);
}

std::vector<int32_t> random_prompt(int64_t n, uint32_t seed, int64_t V) {
  std::vector<int32_t> p;
  uint32_t x = seed;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p.push_back(static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(V)));
  }
  return p;
}

struct Timing {
  std::vector<Clock::time_point> token_times;  // per generated token, of request 0
  std::vector<int32_t> tokens;                 // request 0's tokens
  Clock::time_point start, end;
  int64_t generated = 0;
  double replay_ms = 0;  // the batch-1 decode graph replayed back to back: GPU ms per token (0: no graph)
};

// Runs `batch` requests of `prompt` tokens generating `new_tokens` each (greedy) through a fresh
// engine (decode steps as CUDA graphs or not, their linears on the small-row GEMV or cuBLASLt);
// times every token of request 0 and the whole run.
// The switches inference::ModelRunner reads when an engine is built, for the A/B variants.
const char* const kSwitches[] = {"MT_DECODE_FUSED", "MT_DECODE_ARENA", "MT_DECODE_FUSIONS", "MT_GEMV_KERNEL",
                                 "MT_DECODE_STACK"};
// The whole-stack kernel's own switches are read once per process (kernels/cuda/decode_stack.cu):
// set them for the whole bench (gpu_generate_bench.sh), not per variant.

// `env`: "NAME=VALUE" settings of kSwitches for this engine (the others unset: the defaults).
Timing run(mt::model::GPTModel& m, int64_t batch, int64_t prompt, int64_t new_tokens, bool graphs, bool gemv = true,
           const std::vector<std::string>& env = {}) {
  for (const char* s : kSwitches) unsetenv(s);
  for (const std::string& kv : env) {
    const size_t eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  mt::inference::EngineOptions o;
  o.cuda_graphs = graphs;
  o.small_rows_gemv = gemv;
  o.max_batch = batch;
  o.max_seq_len = prompt + new_tokens + 1;
  o.max_step_tokens = std::max<int64_t>(batch, std::min<int64_t>(batch * prompt, 16384));
  mt::inference::Engine e(m, o);
  Timing t;
  for (int64_t b = 0; b < batch; ++b) {
    mt::inference::Request r;
    r.prompt = random_prompt(prompt, 17u + static_cast<uint32_t>(b), m.config().orig_vocab_size);
    r.max_new_tokens = new_tokens;
    r.on_token = [&t, b](mt::inference::RequestId, int32_t token, float) {
      ++t.generated;
      if (b == 0) {
        t.token_times.push_back(Clock::now());
        t.tokens.push_back(token);
      }
    };
    e.submit(std::move(r));
  }
  t.start = Clock::now();
  e.run_until_idle();
  mt::ops::gpu_context().synchronize();
  t.end = Clock::now();
  // After the timed run: the decode graph alone, 200 replays with no host work between (after 10
  // untimed), so that GPU time and host gaps per token are told apart.
  if (graphs && batch == 1 && e.runner().graph_replay_seconds(1, 10) > 0)
    t.replay_ms = 1e3 * e.runner().graph_replay_seconds(1, 200);
  // MT_DECODE_STACK_TIMES=1: where the whole-stack kernel's time goes in the last replay.
  if (graphs && batch == 1) {
    const std::vector<double> ph = mt::cuda::decode_stack_phase_ns(static_cast<int>(m.config().num_layers));
    if (!ph.empty())
      std::printf("{\"bench\": \"decode_stack_phases_us\", \"qkv\": %.1f, \"attention\": %.1f, \"proj\": %.1f, "
                  "\"fc1\": %.1f, \"fc2\": %.1f, \"barrier_qkv\": %.1f, \"barrier_attention\": %.1f, "
                  "\"barrier_proj\": %.1f, \"barrier_fc1\": %.1f, \"barrier_fc2\": %.1f}\n",
                  ph[0] / 1e3, ph[1] / 1e3, ph[2] / 1e3, ph[3] / 1e3, ph[4] / 1e3, ph[5] / 1e3, ph[6] / 1e3,
                  ph[7] / 1e3, ph[8] / 1e3, ph[9] / 1e3);
  }
  for (const char* s : kSwitches) unsetenv(s);
  return t;
}

int64_t arg(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t prompt = arg(argc, argv, "--prompt", 128), new_tokens = arg(argc, argv, "--new", 256);
  const int64_t batch = arg(argc, argv, "--batch", 64), ttft_prompt = arg(argc, argv, "--ttft-prompt", 2048);
  mt::ops::GpuContext gpu(0);
  mt::model::TransformerConfig c;  // bench/llama_1_5b.sh's shape
  c.num_layers = arg(argc, argv, "--layers", 16);
  c.hidden_size = 2048;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  c.ffn_hidden_size = 8192;
  c.seq_length = std::max<int64_t>(4096, ttft_prompt + 64);
  c.max_position_embeddings = c.seq_length;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.position_embedding_type = "rope";
  c.rotary_base = 500000;
  c.add_bias_linear = c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  c.orig_vocab_size = 128255;
  c.vocab_size = mt::model::padded_vocab_size(128255, 128, 1);
  c.attention_dropout = c.hidden_dropout = 0.f;
  c.bf16 = true;
  const bool fp8 = arg(argc, argv, "--fp8", 0) != 0, graphs_only = arg(argc, argv, "--graphs-only", 0) != 0;
  if (fp8) {
    c.fp8.enabled = true;
    c.fp8.recipe = mt::model::Fp8Recipe::Tensorwise;
  }
  mt::model::GPTModel m(c);
  m.to_device(mt::Device::CUDA);
  const char* fp8_json = fp8 ? "true" : "false";
  double fp8_weight_bytes = 0;  // with --fp8: every weight as the forward reads it
  if (fp8) {
    const mt::model::Fp8WeightMemory mem = mt::model::freeze_fp8_weights(m);
    std::fprintf(stderr, "%s\n", mem.describe().c_str());
    fp8_weight_bytes = static_cast<double>(mem.bytes);
  }
  const double bw = copy_bandwidth();
  std::printf("{\"bench\": \"copy_bandwidth\", \"gpu\": \"%s\", \"read_plus_write_GBps\": %.1f}\n", gpu.name().c_str(),
              bw / 1e9);
  // Bytes a decode step reads per sequence: every bf16 weight but the input embedding (one row).
  double weight_bytes = fp8_weight_bytes;
  for (const auto& p : m.params().params()) {
    if (!fp8 && p.name != "embedding.word_embeddings.weight") weight_bytes += 2.0 * static_cast<double>(p.numel());
    if (fp8 && p.name == "embedding.word_embeddings.weight") weight_bytes -= 2.0 * static_cast<double>(p.numel());
  }
  // K and V, bf16, every layer and query group, per cached position; the model's config has the
  // head dim filled in (the local `c` left kv_channels 0, which made the bound count no cache).
  const auto& mc = m.config();
  const double kv_per_position = 2.0 * 2.0 * static_cast<double>(mc.num_layers * mc.num_query_groups * mc.head_dim());
  std::fflush(stdout);

  // Batch 1: eager, then graphed with the linears on cuBLASLt, then graphed on the GEMV (the
  // default: GEMV linears, the decode kernels), then that with the general kernels
  // (MT_DECODE_FUSED=0) and each other variant; --graphs-only 1 keeps the graphed GEMV runs alone.
  struct Mode {
    bool graphs, gemv;
    const char* path;  // "default": the engine's defaults; else the variant's name
    std::vector<std::string> env;
  };
  const std::vector<Mode> variants{{true, true, "default+stack", {"MT_DECODE_STACK=1"}},
                                   {true, true, "general", {"MT_DECODE_FUSED=0"}},
                                   {true, true, "default-fusions", {"MT_DECODE_FUSIONS=0"}},
                                   {true, true, "default+gemv-base", {"MT_GEMV_KERNEL=base"}},
                                   {true, true, "default-arena", {"MT_DECODE_ARENA=0"}}};
  std::vector<Mode> modes{{false, true, "default", {}}, {true, false, "default", {}}, {true, true, "default", {}}};
  if (graphs_only) modes = {{true, true, "default", {}}};
  modes.insert(modes.end(), variants.begin(), variants.end());
  std::vector<int32_t> default_tokens;  // the default graphed run's, for the variants' check
  for (const auto& [graphs, gemv, path, env] : modes) {
    run(m, 1, prompt, 8, graphs, gemv, env);  // warm-up: cuBLASLt plans, the allocator's pool
    const Timing t = run(m, 1, prompt, new_tokens, graphs, gemv, env);
    const bool variant = !env.empty();
    if (graphs && gemv && !variant) default_tokens = t.tokens;
    const size_t n = t.token_times.size();
    const double decode_s = seconds(t.token_times.front(), t.token_times.back());
    const double tps = static_cast<double>(n - 1) / decode_s;
    const double kv_avg = kv_per_position * (static_cast<double>(prompt) + static_cast<double>(new_tokens) / 2.0);
    const double bound = bw / (weight_bytes + kv_avg);
    std::printf("{\"bench\": \"decode_batch1\", \"fp8\": %s, \"cuda_graphs\": %s, \"linears\": \"%s\", "
                "\"path\": \"%s\", \"same_tokens\": %s, \"prompt\": %lld, \"new_tokens\": %lld, "
                "\"tokens_per_s\": %.1f, \"ms_per_token\": %.3f, \"graph_gpu_ms_per_token\": %.3f, "
                "\"host_gap_ms_per_token\": %.3f, \"gpu_fraction_of_bound\": %.3f, \"weight_bytes\": %.0f, "
                "\"kv_bytes_per_token_avg\": %.0f, \"bound_tokens_per_s\": %.1f, \"fraction_of_bound\": %.3f}\n",
                fp8_json, graphs ? "true" : "false", gemv ? "gemv" : "cublaslt", path,
                !variant ? "null" : (t.tokens == default_tokens ? "true" : "false"), static_cast<long long>(prompt),
                static_cast<long long>(new_tokens), tps, 1e3 / tps, t.replay_ms,
                t.replay_ms > 0 ? 1e3 / tps - t.replay_ms : 0.0, t.replay_ms > 0 ? 1e3 / t.replay_ms / bound : 0.0,
                weight_bytes, kv_avg, bound, tps / bound);
    std::fflush(stdout);
  }
  const std::vector<bool> graph_modes = graphs_only ? std::vector<bool>{true} : std::vector<bool>{false, true};
  for (const bool graphs : graph_modes) {
    run(m, batch, prompt, 4, graphs);  // warm-up at this batch's GEMM shapes (autotuned on first use)
    const Timing t = run(m, batch, prompt, new_tokens, graphs);
    const double total_s = seconds(t.start, t.end);
    // Decode-only: from request 0's first token (every prompt prefilled in the first step) to the end.
    const double decode_s = seconds(t.token_times.front(), t.end);
    const double decode_tokens = static_cast<double>(t.generated - batch);
    std::printf("{\"bench\": \"decode_batch%lld\", \"fp8\": %s, \"cuda_graphs\": %s, \"prompt\": %lld, \"new_tokens\": %lld, "
                "\"tokens_per_s_with_prefill\": %.1f, \"decode_tokens_per_s\": %.1f}\n",
                static_cast<long long>(batch), fp8_json, graphs ? "true" : "false", static_cast<long long>(prompt),
                static_cast<long long>(new_tokens), static_cast<double>(t.generated) / total_s,
                decode_tokens / decode_s);
    std::fflush(stdout);
  }
  if (ttft_prompt > 0) {
    run(m, 1, ttft_prompt, 1, false);  // warm-up
    const Timing t = run(m, 1, ttft_prompt, 1, false);
    std::printf("{\"bench\": \"ttft_%lld\", \"fp8\": %s, \"ms\": %.2f}\n", static_cast<long long>(ttft_prompt), fp8_json,
                1e3 * seconds(t.start, t.token_times.front()));
  }
  return 0;
}
