// cuda_ops_bench --only=gemvchain (issue #22): how fast decode's GEMVs stream their weights when
// they run back to back inside one CUDA graph, as a batch-1 decode step runs them (programmatic
// dependent launches, each GEMV's first loads overlapping the one before). The kernel profile
// (bench/gpu_kernel_profile.sh decode) times each kernel alone with the caches flushed, which
// cannot show that overlap; this says what the GEMVs reach in place, so that the rest of a decode
// step's GPU time (attention, the head's argmax, the gaps) is the step's time minus this.
//
// llama-1.5b's shapes (hidden 2048, QKV 3072, FFN 8192, 16 layers, vocabulary 128,256), with the
// decode fusions the model uses: RMSNorm into QKV and fc1, SwiGLU into fc1, the residual into proj
// and fc2 (the QKV's cache epilogue is left out: its writes are 12 KB). Every layer has its own
// weights, so a replay reads ~2.4 GB, 48x the L2. Rows: the whole chain with the output layer, the
// 16 layers alone, and each shape chained 16 deep alone; each in ms per replay, GB/s of weights
// and as a fraction of the measured copy rate; for the Wide GEMV (the default) and the Base one.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/device.h"
#include "ops_bench.h"

namespace mt::bench {

namespace {

constexpr int64_t kHidden = 2048, kQkv = 3072, kFfn = 8192, kVocab = 128256;
constexpr int kLayers = 16;

cudaStream_t stream() { return cuda::compute_stream(); }

Tensor random_bf16(int64_t n, uint64_t seed, float scale) {
  Tensor t = Tensor::empty({n}, DType::BF16, Device::CUDA);
  fill_uniform_bf16(t.raw(), n, seed, -scale, scale, stream());
  return t;
}

struct Layer {
  Tensor qkv, proj, fc1, fc2, norm1, norm2;
};

// ms per replay of the graph that `record` captures on the compute stream (median of 5 x 20).
double graph_ms(const std::function<void()>& record) {
  cudaStream_t s = stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  record();
  MT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = time_ms([&](int) { MT_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 20, 5, s);
  MT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  MT_CUDA_CHECK(cudaGraphDestroy(graph));
  return ms;
}

}  // namespace

void bench_gemv_chain() {
  using bf16 = __nv_bfloat16;
  ops::GpuContext ctx(0);
  // The copy rate the decode bound uses (bench/generate_bench.cpp: read + write of a 1 GiB copy).
  const int64_t copy_bytes = int64_t{1} << 30;
  Tensor a = Tensor::empty({copy_bytes}, DType::U8, Device::CUDA), b = Tensor::empty({copy_bytes}, DType::U8, Device::CUDA);
  const double copy_ms = time_ms(
      [&](int) { MT_CUDA_CHECK(cudaMemcpyAsync(b.raw(), a.raw(), copy_bytes, cudaMemcpyDeviceToDevice, stream())); },
      10, 5, stream());
  const double copy_rate = 2.0 * static_cast<double>(copy_bytes) / copy_ms * 1e-6;
  report("copy_d2d", "1024 MiB", copy_ms, copy_rate, "GB/s");
  a = Tensor();
  b = Tensor();

  std::vector<Layer> layers;
  uint64_t seed = 1;
  const float ws = 0.02f;
  for (int l = 0; l < kLayers; ++l)
    layers.push_back({random_bf16(kQkv * kHidden, seed++, ws), random_bf16(kHidden * kHidden, seed++, ws),
                      random_bf16(2 * kFfn * kHidden, seed++, ws), random_bf16(kHidden * kFfn, seed++, ws),
                      random_bf16(kHidden, seed++, 1.f), random_bf16(kHidden, seed++, 1.f)});
  Tensor head = random_bf16(kVocab * kHidden, seed++, ws);
  Tensor x = random_bf16(kHidden, seed++, 1.f), qkv = random_bf16(kQkv, seed++, 1.f);
  Tensor attn = random_bf16(kHidden, seed++, 1.f), h = random_bf16(kFfn, seed++, 1.f);
  Tensor logits = random_bf16(kVocab, seed++, 1.f);
  MT_CUDA_CHECK(cudaStreamSynchronize(stream()));

  auto X = [](Tensor& t) { return t.data<bf16>(); };
  const cudaStream_t s = stream();
  auto qkv_gemv = [&](Layer& L) {
    cuda::GemvFusion f;
    f.norm_weight = L.norm1.raw();
    f.eps = 1e-5f;
    cuda::gemv_forward<bf16, bf16>(X(x), X(L.qkv), nullptr, nullptr, X(qkv), 1, kQkv, kHidden, s, f);
  };
  auto proj_gemv = [&](Layer& L) {
    cuda::gemv_forward<bf16, bf16>(X(attn), X(L.proj), nullptr, X(x), X(x), 1, kHidden, kHidden, s);
  };
  auto fc1_gemv = [&](Layer& L) {
    cuda::GemvFusion f;
    f.norm_weight = L.norm2.raw();
    f.eps = 1e-5f;
    f.swiglu = true;
    cuda::gemv_forward<bf16, bf16>(X(x), X(L.fc1), nullptr, nullptr, X(h), 1, 2 * kFfn, kHidden, s, f);
  };
  auto fc2_gemv = [&](Layer& L) {
    cuda::gemv_forward<bf16, bf16>(X(h), X(L.fc2), nullptr, X(x), X(x), 1, kHidden, kFfn, s);
  };
  auto head_gemv = [&]() {
    cuda::gemv_forward<bf16, bf16>(X(x), X(head), nullptr, nullptr, X(logits), 1, kVocab, kHidden, s);
  };
  const double layer_bytes = 2.0 * (kQkv * kHidden + kHidden * kHidden + 2 * kFfn * kHidden + kHidden * kFfn);
  const double head_bytes = 2.0 * kVocab * kHidden;

  struct Kind {
    const char* name;
    ops::InferenceGemv::Kernel kernel;
  };
  for (const Kind k : {Kind{"wide", ops::InferenceGemv::Kernel::Wide}, Kind{"base", ops::InferenceGemv::Kernel::Base}}) {
    ops::InferenceGemv scope(true, k.kernel);
    auto row = [&](const std::string& what, double bytes, const std::function<void()>& record) {
      const double ms = graph_ms(record);
      const double rate = bytes / ms * 1e-6;
      char extra[96];
      std::snprintf(extra, sizeof extra, ",\"fraction_of_copy_rate\":%.3f,\"kernel\":\"%s\"", rate / copy_rate, k.name);
      report(std::string("gemv_chain_") + k.name, what, ms, rate, "GB/s", extra);
    };
    row("16 layers + head", kLayers * layer_bytes + head_bytes, [&] {
      for (Layer& L : layers) qkv_gemv(L), proj_gemv(L), fc1_gemv(L), fc2_gemv(L);
      head_gemv();
    });
    row("16 layers", kLayers * layer_bytes, [&] {
      for (Layer& L : layers) qkv_gemv(L), proj_gemv(L), fc1_gemv(L), fc2_gemv(L);
    });
    row("qkv x16 (3072x2048, norm)", kLayers * 2.0 * kQkv * kHidden, [&] {
      for (Layer& L : layers) qkv_gemv(L);
    });
    row("proj x16 (2048x2048, residual)", kLayers * 2.0 * kHidden * kHidden, [&] {
      for (Layer& L : layers) proj_gemv(L);
    });
    row("fc1 x16 (16384x2048, norm+swiglu)", kLayers * 4.0 * kFfn * kHidden, [&] {
      for (Layer& L : layers) fc1_gemv(L);
    });
    row("fc2 x16 (2048x8192, residual)", kLayers * 2.0 * kHidden * kFfn, [&] {
      for (Layer& L : layers) fc2_gemv(L);
    });
    row("head (128256x2048)", head_bytes, [&] { head_gemv(); });
  }
}

}  // namespace mt::bench
