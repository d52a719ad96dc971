// Microbenchmarks of the CUDA ops at llama-1.5b shapes (DESIGN.md): cuBLASLt GEMMs, flash
// attention forward/backward (our kernels, then cuDNN's where available), and the memory-bound
// kernels. Timed with CUDA events after warm-up; each figure is the median of several timed
// batches. Inputs are random (never zeros) and memory-bound kernels rotate over several input
// sets so that the 50 MB L2 does not serve repeated reads. Prints one JSON line per measurement
// and a table at the end.
//
// GEMMs are timed with cuBLASLt autotuning off (the heuristic's choice) and on (ops *_tuned);
// MT_GEMM_TUNE=verbose also prints each tuned shape's choice to stderr.
//
//   cuda_ops_bench [--quick] [--only=gemm|attn|mem|longattn|varlen|fp8cast|fp8gemm] [--seq=N]
//                  [--varlen-layouts=tokens,heads]
//
// fp8cast / fp8gemm (bench/cuda/fp8_ops_bench.cpp): the FP8 casts of the tensorwise recipe at
// llama-1.5b's shapes in GB/s against the measured copy rate, and the FP8 GEMMs tuned and not.
//
// longattn (bench/gpu_longseq_bench.sh): llama-1.5b's heads (32 query, 8 key/value, dim 64) at
// one sequence of --seq tokens (default 32768), causal, then the same sequence packed with
// documents of 4096 tokens (the ranged kernels; FLOPs counted over the documents' triangles).
#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/ops_bench.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"

using namespace mt::cuda;
using mt::bench::report;
using mt::bench::time_ms;

namespace {

bool g_quick = false;
std::string g_varlen_layouts = "tokens,heads";  // --varlen-layouts: the cuDNN layouts --only=varlen times

template <typename T>
DeviceBuffer<T> random_buffer(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> h(n);
  for (auto& x : h) x = d(gen);
  DeviceBuffer<T> b(n);
  b.upload(h);
  return b;
}

struct Row {
  std::string op, shape;
  double ms, rate;
  const char* unit;
};
std::vector<Row> g_rows;

// Uniform values in [lo, hi) from a per-element hash, generated on the device: the GEMM inputs
// reach 1e9 elements (the LM head's logits gradient), too many to draw on the host.
template <typename T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.f / 16777216.f);
    if constexpr (std::is_same_v<T, float>)
      p[i] = lo + (hi - lo) * u;
    else
      p[i] = __float2bfloat16_rn(lo + (hi - lo) * u);
  }
}
template <typename T>
DeviceBuffer<T> device_random(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  DeviceBuffer<T> b(n);
  fill_uniform_kernel<<<4096, 256>>>(b.get(), static_cast<int64_t>(n), seed, lo, hi);
  MT_CUDA_CHECK(cudaGetLastError());
  return b;
}

// One GEMM timed with tuning off (the heuristic's first choice, op name as before) and on
// (suffix _tuned; the first tuned call, which times the candidates, is timed apart and added to
// *tune_ms). Returns {ms off, ms on}.
std::pair<double, double> time_tuned(Gemm& gemm, const std::string& op, const std::string& shape, double flop, int it,
                                     const std::function<void(int)>& f, double* tune_ms) {
  gemm.set_tuning(false);
  const double off = time_ms(f, it);
  report(op, shape, off, flop / off * 1e-9, "TFLOP/s");
  gemm.set_tuning(true);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  f(0);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  *tune_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const double on = time_ms(f, it);
  report(op + "_tuned", shape, on, flop / on * 1e-9, "TFLOP/s");
  return {off, on};
}

// The llama-1.5b GEMMs of one micro-batch (4 x 2048 tokens; hidden 2048, 32 query heads and 8
// key/value groups of 64, SwiGLU FFN 8192, vocab 128256), each forward, dgrad and wgrad (fp32
// accumulation, beta = 1), with tuning off and on; then the sum over one micro-batch's GEMMs
// (16 layers and the LM head). 8192x2048->6144 is kept for comparison with older results.
void bench_gemm() {
  Gemm gemm;
  struct S {
    int64_t M, K, N;
    const char* what;
    int per_microbatch;
  };
  constexpr int kLayers = 16;
  const S shapes[] = {{8192, 2048, 6144, "", 0},
                      {8192, 2048, 3072, " qkv", kLayers},
                      {8192, 2048, 2048, " proj", kLayers},
                      {8192, 2048, 16384, " fc1", kLayers},
                      {8192, 8192, 2048, " fc2", kLayers},
                      {8192, 2048, 128256, " lm_head", 1}};
  double step_flop = 0, step_off = 0, step_on = 0, tune_ms = 0;
  for (const S& s : shapes) {
    auto x = device_random<bf16>(s.M * s.K, 1), w = device_random<bf16>(s.N * s.K, 2);
    auto dy = device_random<bf16>(s.M * s.N, 3);
    DeviceBuffer<bf16> y(s.M * s.N), dx(s.M * s.K);
    DeviceBuffer<float> dw(s.N * s.K);
    dw.fill_bytes(0);
    const double flop = 2.0 * s.M * s.N * s.K;
    const std::string shape = std::to_string(s.M) + "x" + std::to_string(s.K) + "->" + std::to_string(s.N) + s.what;
    const int it = g_quick ? 5 : (s.N > 100000 ? 10 : 20);
    const auto fwd = time_tuned(
        gemm, "gemm_fwd_bf16", shape, flop, it,
        [&](int) {
          linear_forward(gemm, x.get(), w, static_cast<const bf16*>(nullptr), y.get(), s.M, s.N, s.K, nullptr);
        },
        &tune_ms);
    const auto dgrad = time_tuned(
        gemm, "gemm_dgrad_bf16", shape, flop, it,
        [&](int) { linear_backward(gemm, dy.get(), x, w, dx, nullptr, nullptr, s.M, s.N, s.K, nullptr); }, &tune_ms);
    const auto wgrad = time_tuned(
        gemm, "gemm_wgrad_bf16_f32acc", shape, flop, it,
        [&](int) { linear_backward(gemm, dy.get(), x, w, nullptr, dw, nullptr, s.M, s.N, s.K, nullptr); }, &tune_ms);
    step_flop += s.per_microbatch * 3 * flop;
    step_off += s.per_microbatch * (fwd.first + dgrad.first + wgrad.first);
    step_on += s.per_microbatch * (fwd.second + dgrad.second + wgrad.second);
  }
  const std::string all = "llama-1.5b micro-batch, 16 layers + head";
  report("gemm_sum", all, step_off, step_flop / step_off * 1e-9, "TFLOP/s");
  report("gemm_sum_tuned", all, step_on, step_flop / step_on * 1e-9, "TFLOP/s");
  std::printf("{\"op\":\"gemm_tuning\",\"shapes\":%d,\"first_calls_ms\":%.1f}\n", gemm.tuned_shapes(), tune_ms);
}

void bench_attention(int64_t B, int64_t H, int64_t Hkv, int64_t S, int64_t D) {
  mt::ops::AttentionShape p{B, H, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = true;
  const size_t nq = B * H * S * D, nk = B * Hkv * S * D;
  auto q = random_buffer<bf16>(nq, 11, -2, 2), k = random_buffer<bf16>(nk, 12, -2, 2), v = random_buffer<bf16>(nk, 13);
  auto dout = random_buffer<bf16>(nq, 14);
  DeviceBuffer<bf16> out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(B * H * S);
  // Causal: half of the S x S score matrix. Forward 2 GEMMs, backward 5 (the usual count; our
  // deterministic backward computes 7).
  const double fwd_flop = 4.0 * B * H * S * S * D / 2.0, bwd_flop = 2.5 * fwd_flop;
  char shape[128];
  std::snprintf(shape, sizeof shape, "B%lld H%lld Hkv%lld S%lld D%lld causal", static_cast<long long>(B),
                static_cast<long long>(H), static_cast<long long>(Hkv), static_cast<long long>(S),
                static_cast<long long>(D));
  const int it = g_quick ? 3 : 10;
  // Our flash kernels (--attention-backend flash), then cuDNN's fused attention (fused) where
  // this build and the loaded cuDNN can run the shape.
  set_attention_backend(AttentionBackend::Flash);
  const double f = time_ms([&](int) { attention_forward(p, q.get(), k, v, out, lse, nullptr); }, it);
  const double b = time_ms([&](int) { attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr); }, it);
  set_attention_backend(AttentionBackend::Auto);
  report("attn_fwd", shape, f, fwd_flop / f * 1e-9, "TFLOP/s");
  report("attn_bwd", shape, b, bwd_flop / b * 1e-9, "TFLOP/s");
  report("attn_fwd_bwd", shape, f + b, (fwd_flop + bwd_flop) / (f + b) * 1e-9, "TFLOP/s");
  std::string why;
  if (!cudnn_attention_supported(p, &why)) {
    std::printf("cudnn attention unavailable for %s: %s\n", shape, why.c_str());
    return;
  }
  for (bool bwd : {false, true})
    if (const std::string e = cudnn_attention_prepare(p, bwd); !e.empty()) {
      std::printf("cudnn attention unavailable for %s: %s\n", shape, e.c_str());
      return;
    }
  const double cf = time_ms([&](int) { cudnn_attention_forward(p, q.get(), k, v, out, lse, nullptr); }, it);
  const double cb =
      time_ms([&](int) { cudnn_attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr); }, it);
  report("attn_fwd_cudnn", shape, cf, fwd_flop / cf * 1e-9, "TFLOP/s");
  report("attn_bwd_cudnn", shape, cb, bwd_flop / cb * 1e-9, "TFLOP/s");
  report("attn_fwd_bwd_cudnn", shape, cf + cb, (fwd_flop + bwd_flop) / (cf + cb) * 1e-9, "TFLOP/s");
  // cuDNN's dQ-atomics backward (--nondeterministic-attention; not run-to-run deterministic).
  if (cudnn_attention_prepare(p, true, false).empty()) {
    const double cn = time_ms(
        [&](int) { cudnn_attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr, false); }, it);
    report("attn_bwd_cudnn_nondet", shape, cn, bwd_flop / cn * 1e-9, "TFLOP/s");
  }
}

// A packed sequence: B = 1, documents of `doc` tokens, through the ranged tensor-core kernels
// (kernels/cuda/attention_fwd.cu); the FLOPs are those of the documents' causal triangles.
void bench_packed_attention(int64_t H, int64_t Hkv, int64_t S, int64_t D, int64_t doc) {
  mt::ops::AttentionShape p{1, H, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  std::vector<int32_t> cu{0};
  double tri = 0;  // sum of the documents' squared lengths
  for (int64_t a = 0; a < S; a += doc) {
    const int64_t e = std::min(S, a + doc);
    cu.push_back(static_cast<int32_t>(e));
    tri += static_cast<double>(e - a) * static_cast<double>(e - a);
  }
  DeviceBuffer<int32_t> dcu(cu);
  p.cu_seqlens = dcu.get();
  p.num_segments = static_cast<int64_t>(cu.size()) - 1;
  const size_t nq = H * S * D, nk = Hkv * S * D;
  auto q = random_buffer<bf16>(nq, 21, -2, 2), k = random_buffer<bf16>(nk, 22, -2, 2), v = random_buffer<bf16>(nk, 23);
  auto dout = random_buffer<bf16>(nq, 24);
  DeviceBuffer<bf16> out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(H * S);
  const double fwd_flop = 4.0 * H * tri * D / 2.0, bwd_flop = 2.5 * fwd_flop;
  char shape[128];
  std::snprintf(shape, sizeof shape, "H%lld Hkv%lld S%lld D%lld causal docs of %lld", static_cast<long long>(H),
                static_cast<long long>(Hkv), static_cast<long long>(S), static_cast<long long>(D),
                static_cast<long long>(doc));
  const int it = g_quick ? 3 : 10;
  const double f = time_ms([&](int) { attention_forward(p, q.get(), k, v, out, lse, nullptr); }, it);
  const double b = time_ms([&](int) { attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr); }, it);
  report("attn_fwd_packed", shape, f, fwd_flop / f * 1e-9, "TFLOP/s");
  report("attn_bwd_packed", shape, b, bwd_flop / b * 1e-9, "TFLOP/s");
  report("attn_fwd_bwd_packed", shape, f + b, (fwd_flop + bwd_flop) / (f + b) * 1e-9, "TFLOP/s");
}

// Packed documents, both GPU paths (--only=varlen): the ranged tensor-core kernels
// (--attention-backend flash) and cuDNN's ragged graph (attention_cudnn.h), fwd+bwd, at
// llama-1.5b's heads, 16384 tokens per batch or more (B = 16384 / S samples of S tokens). FLOPs are
// only the documents' causal triangles. One JSON line per case with both rates; the numbers
// behind auto's rule (varlen_auto_prefers_cudnn in kernels/cuda/attention_cudnn.cpp).
// Document lengths within a sample, by mix: "uniform" draws from [lo, hi] (the last one cut to
// fit), "long" is S/2, S/4, S/8, S/8.
std::vector<int32_t> doc_lengths(const std::string& mix, int64_t S, int64_t lo, int64_t hi, std::mt19937_64& gen) {
  std::vector<int32_t> d;
  if (mix == "long") {
    for (int64_t n : {S / 2, S / 4, S / 8, S / 8}) d.push_back(static_cast<int32_t>(n));
    return d;
  }
  std::uniform_int_distribution<int64_t> u(lo, hi);
  for (int64_t t = 0; t < S;) {
    const int64_t n = std::min<int64_t>(S - t, u(gen));
    d.push_back(static_cast<int32_t>(n));
    t += n;
  }
  return d;
}

// printf into a growing JSON line.
void appendf(std::string& out, const char* f, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string& out, const char* f, ...) {
  char buf[1024];
  va_list a;
  va_start(a, f);
  std::vsnprintf(buf, sizeof buf, f, a);
  va_end(a);
  out += buf;
}

void bench_varlen_attention(int64_t S, const std::string& mix, int64_t lo, int64_t hi) {
  const int64_t H = 32, Hkv = 8, D = 64, B = std::max<int64_t>(1, 16384 / S);
  std::mt19937_64 gen(static_cast<uint64_t>(S * 131 + lo));
  std::vector<int32_t> cu{0};
  double tri = 0;  // sum of the documents' squared lengths
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int32_t n : doc_lengths(mix, S, lo, hi, gen)) {
      cu.push_back(cu.back() + n);
      tri += static_cast<double>(n) * n;
      longest = std::max<int64_t>(longest, n);
    }
  DeviceBuffer<int32_t> dcu(cu);
  mt::ops::AttentionShape p{B, H, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.cu_seqlens = dcu.get();
  p.cu_seqlens_host = cu.data();
  p.num_segments = static_cast<int64_t>(cu.size()) - 1;
  const size_t nq = B * H * S * D, nk = B * Hkv * S * D;
  auto q = random_buffer<bf16>(nq, 31, -2, 2), k = random_buffer<bf16>(nk, 32, -2, 2), v = random_buffer<bf16>(nk, 33);
  auto dout = random_buffer<bf16>(nq, 34);
  DeviceBuffer<bf16> out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse(B * H * S);
  const double fwd_flop = 4.0 * H * tri * D / 2.0, flop = 3.5 * fwd_flop;  // backward: 2.5 x forward
  const int it = g_quick ? 3 : 10;
  set_attention_backend(AttentionBackend::Flash);
  const double rf = time_ms([&](int) { attention_forward(p, q.get(), k, v, out, lse, nullptr); }, it);
  const double rb = time_ms([&](int) { attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr); }, it);
  set_attention_backend(AttentionBackend::Auto);
  std::string line;
  appendf(line,
          "{\"op\":\"attn_varlen\",\"S\":%lld,\"B\":%lld,\"mix\":\"%s\",\"docs\":%lld,\"mean_doc\":%.0f,\"max_doc\":%lld,"
          "\"ranged_fwd_ms\":%.4f,\"ranged_bwd_ms\":%.4f,\"ranged_tflops\":%.1f",
          static_cast<long long>(S), static_cast<long long>(B), mix.c_str(), static_cast<long long>(p.num_segments),
          static_cast<double>(B * S) / p.num_segments, static_cast<long long>(longest), rf, rb, flop / (rf + rb) * 1e-9);
  // cuDNN, per layout (Heads: in place; Tokens: token-major copies, timed with them): the
  // deterministic backward (training's default) and the dQ-atomics one
  // (--nondeterministic-attention), which needs no docs x Hq x S x S workspace.
  auto quoted = [](const std::string& e) {
    std::string r;
    for (char c : e.substr(0, 200)) r += (c == '"' || c == '\\') ? '\'' : c;
    return r;
  };
  const VarlenBuckets vb = varlen_buckets(p);
  appendf(line, ",\"cudnn_buckets\":\"%lldx%lld\"", static_cast<long long>(vb.docs), static_cast<long long>(vb.max_len));
  const VarlenLayout saved = varlen_layout();
  // Tokens first: the THD layout cuDNN documents; Heads (in place) after it.
  for (const VarlenLayout layout : {VarlenLayout::Tokens, VarlenLayout::Heads}) {
    const std::string tag = varlen_layout_name(layout);
    if (g_varlen_layouts.find(tag) == std::string::npos) continue;
    set_varlen_layout(layout);
    if (const std::string e = cudnn_attention_varlen_prepare(p, false); !e.empty()) {
      appendf(line, ",\"%s_tflops\":null,\"%s_error\":\"%s\"", tag.c_str(), tag.c_str(), quoted(e).c_str());
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();  // the first call builds the forward graph
    cudnn_attention_varlen_forward(p, q.get(), k, v, out, lse, nullptr);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    const double build = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double cf = time_ms([&](int) { cudnn_attention_varlen_forward(p, q.get(), k, v, out, lse, nullptr); }, it);
    appendf(line, ",\"%s_fwd_build_ms\":%.0f,\"%s_fwd_ms\":%.4f", tag.c_str(), build, tag.c_str(), cf);
    for (const bool det : {true, false}) {
      const std::string t = tag + (det ? "" : "_nondet");
      if (const std::string e = cudnn_attention_varlen_prepare(p, true, det); !e.empty()) {
        appendf(line, ",\"%s_tflops\":null,\"%s_error\":\"%s\"", t.c_str(), t.c_str(), quoted(e).c_str());
        continue;
      }
      const double cb = time_ms(
          [&](int) { cudnn_attention_varlen_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr, det); },
          it);
      appendf(line, ",\"%s_bwd_ms\":%.4f,\"%s_tflops\":%.1f", t.c_str(), cb, t.c_str(), flop / (cf + cb) * 1e-9);
    }
  }
  set_varlen_layout(saved);
  std::printf("%s}\n", line.c_str());
  std::fflush(stdout);
}

void bench_memory_bound() {
  constexpr int kSets = 3;  // rotating input sets: 3 x >= 32 MB does not fit the L2
  const int64_t rows = 8192, dim = 2048;
  const int it = g_quick ? 6 : 30;
  {
    std::vector<DeviceBuffer<bf16>> x, y, dy, dx;
    for (int i = 0; i < kSets; ++i) {
      x.push_back(random_buffer<bf16>(rows * dim, 20 + i));
      dy.push_back(random_buffer<bf16>(rows * dim, 30 + i));
      y.emplace_back(rows * dim);
      dx.emplace_back(rows * dim);
    }
    auto w = random_buffer<bf16>(dim, 40, 0.5f, 1.5f);
    DeviceBuffer<float> rstd(rows), dw(dim);
    dw.fill_bytes(0);
    const double bytes = rows * dim * 2.0;
    const std::string shape = std::to_string(rows) + "x" + std::to_string(dim) + " bf16";
    double ms = time_ms(
        [&](int i) { rmsnorm_forward(x[i % kSets].get(), w, y[i % kSets], rstd, rows, dim, 1e-5f, nullptr); }, it);
    report("rmsnorm_fwd", shape, ms, 2 * bytes / ms * 1e-6, "GB/s");
    ms = time_ms(
        [&](int i) {
          rmsnorm_backward(dy[i % kSets].get(), x[i % kSets], w, rstd, dx[i % kSets], dw, rows, dim, nullptr);
        },
        it);
    report("rmsnorm_bwd", shape, ms, 3 * bytes / ms * 1e-6, "GB/s");
    ms = time_ms(  // with the residual gradient added in the same pass (dx_add = the next set's x)
        [&](int i) {
          rmsnorm_backward(dy[i % kSets].get(), x[i % kSets], w, rstd, dx[i % kSets], dw, rows, dim, nullptr,
                           x[(i + 1) % kSets]);
        },
        it);
    report("rmsnorm_bwd_add", shape, ms, 4 * bytes / ms * 1e-6, "GB/s");
    ms = time_ms(
        [&](int i) {
          add_rmsnorm_forward(x[i % kSets].get(), dy[i % kSets], dx[i % kSets], w, y[i % kSets], rstd, rows, dim, 1e-5f,
                              nullptr);
        },
        it);
    report("add_rmsnorm_fwd", shape, ms, 4 * bytes / ms * 1e-6, "GB/s");
    DeviceBuffer<bf16> b(dim);
    b.fill_bytes(0);
    DeviceBuffer<float> mean(rows), db(dim);
    db.fill_bytes(0);
    ms = time_ms(
        [&](int i) {
          layernorm_forward(x[i % kSets].get(), w, b, y[i % kSets], mean, rstd, rows, dim, 1e-5f, nullptr);
        },
        it);
    report("layernorm_fwd", shape, ms, 2 * bytes / ms * 1e-6, "GB/s");
    ms = time_ms(
        [&](int i) {
          layernorm_backward(dy[i % kSets].get(), x[i % kSets], w, mean, rstd, dx[i % kSets], dw, db, rows, dim,
                             nullptr);
        },
        it);
    report("layernorm_bwd", shape, ms, 3 * bytes / ms * 1e-6, "GB/s");
  }
  {
    const int64_t F = 8192;
    auto x = random_buffer<bf16>(rows * 2 * F, 50), dy = random_buffer<bf16>(rows * F, 51);
    DeviceBuffer<bf16> y(rows * F), dx(rows * 2 * F);
    const std::string shape = std::to_string(rows) + "x2x" + std::to_string(F) + " bf16";
    double ms = time_ms([&](int) { swiglu_forward(x.get(), y, rows, F, nullptr); }, it);
    report("swiglu_fwd", shape, ms, rows * F * 2.0 * 3 / ms * 1e-6, "GB/s");
    ms = time_ms([&](int) { swiglu_backward(dy.get(), x, dx, rows, F, nullptr); }, it);
    report("swiglu_bwd", shape, ms, rows * F * 2.0 * 5 / ms * 1e-6, "GB/s");
  }
  {
    const int64_t N = 8192, V = 128256;
    auto logits = random_buffer<bf16>(N * V, 60, -8, 8);
    std::vector<int32_t> t(N);
    for (int64_t i = 0; i < N; ++i) t[i] = static_cast<int32_t>((i * 7919) % V);
    DeviceBuffer<int32_t> tg(t);
    DeviceBuffer<float> loss(N), lse(N), dl(N);
    std::vector<float> ones(N, 1.f / N);
    dl.upload(ones);
    DeviceBuffer<bf16> dlog(N * V);
    const double bytes = N * V * 2.0;
    const std::string shape = std::to_string(N) + "x" + std::to_string(V) + " bf16";
    const int cit = g_quick ? 3 : 10;
    double ms = time_ms([&](int) { cross_entropy_forward(logits.get(), tg, loss, lse, N, V, V, nullptr); }, cit);
    report("cross_entropy_fwd", shape, ms, bytes / ms * 1e-6, "GB/s");
    ms = time_ms([&](int) { cross_entropy_backward(logits.get(), tg, lse, dl, dlog, N, V, V, nullptr); }, cit);
    report("cross_entropy_bwd", shape, ms, 2 * bytes / ms * 1e-6, "GB/s");
    // What a training step runs: forward then backward (3 passes over the logits), against the
    // fused kernel (read once, gradient written once; the cluster size it picks, then forced).
    ms = time_ms(
        [&](int) {
          cross_entropy_forward(logits.get(), tg, loss, lse, N, V, V, nullptr);
          cross_entropy_backward(logits.get(), tg, lse, dl, dlog, N, V, V, nullptr);
        },
        cit);
    report("cross_entropy_fwd+bwd", shape, ms, 3 * bytes / ms * 1e-6, "GB/s");
    const int picked = cross_entropy_fused(logits.get(), tg, dl, loss, lse, dlog, N, V, V, nullptr);
    ms = time_ms([&](int) { cross_entropy_fused(logits.get(), tg, dl, loss, lse, dlog, N, V, V, nullptr); }, cit);
    report("cross_entropy_fused", shape + " cluster " + std::to_string(picked), ms, 2 * bytes / ms * 1e-6, "GB/s");
    for (int c : {2, 4, 8}) {
      if (c == picked) continue;
      ms = time_ms([&](int) { cross_entropy_fused(logits.get(), tg, dl, loss, lse, dlog, N, V, V, nullptr, c); }, cit);
      report("cross_entropy_fused", shape + " cluster " + std::to_string(c), ms, 2 * bytes / ms * 1e-6, "GB/s");
    }
  }
  {
    // AdamW over 1.5e9/8 fp32 params (kept moderate for memory): reads p, g, m, v; writes p, m, v, bf16 p.
    const int64_t n = int64_t{1} << 27;
    auto p = random_buffer<float>(n, 70), g = random_buffer<float>(n, 71, -0.01f, 0.01f);
    DeviceBuffer<float> m(n), v(n);
    m.fill_bytes(0), v.fill_bytes(0);
    DeviceBuffer<bf16> out(n);
    AdamWHyper h;
    const std::vector<AdamWTensor> ts{{p, g, m, v, out, n, true}};
    const double ms = time_ms(
        [&](int i) {
          h.step = i + 1;
          adamw_step(ts, h, nullptr);
        },
        g_quick ? 3 : 10);
    report("adamw_step", std::to_string(n) + " params", ms, n * (4.0 * 7 + 2) / ms * 1e-6, "GB/s");
    const std::vector<GradSpan> spans{{g, n}};
    DeviceBuffer<double> nsq(1);
    const double ms2 = time_ms([&](int) { grad_norm_squared(spans, nsq, nullptr); }, g_quick ? 3 : 10);
    report("grad_norm", std::to_string(n) + " params", ms2, n * 4.0 / ms2 * 1e-6, "GB/s");
  }
}

}  // namespace

namespace mt::bench {

bool quick() { return g_quick; }

void fill_uniform_bf16(void* p, int64_t n, uint64_t seed, float lo, float hi, cudaStream_t s) {
  fill_uniform_kernel<<<4096, 256, 0, s>>>(static_cast<bf16*>(p), n, seed, lo, hi);
  MT_CUDA_CHECK(cudaGetLastError());
}

double time_ms(const std::function<void(int)>& f, int iters, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  MT_CUDA_CHECK(cudaEventCreate(&a));
  MT_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) f(i);  // warm-up: handles, plans, module load
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    MT_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) f(i);
    MT_CUDA_CHECK(cudaEventRecord(b, s));
    MT_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void report(const std::string& op, const std::string& shape, double ms, double rate, const char* unit,
            const std::string& extra) {
  std::printf("{\"op\":\"%s\",\"shape\":\"%s\",\"ms\":%.4f,\"%s\":%.1f%s}\n", op.c_str(), shape.c_str(), ms, unit,
              rate, extra.c_str());
  std::fflush(stdout);
  g_rows.push_back({op, shape, ms, rate, unit});
}

}  // namespace mt::bench

int main(int argc, char** argv) {
  // --only=gemm|attn|mem|longattn|varlen|fp8cast|fp8gemm|gemvchain runs one group (the last five only when named)
  std::string only;
  int64_t seq = 32768;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) g_quick = true;
    if (std::strncmp(argv[i], "--only=", 7) == 0) only = argv[i] + 7;
    if (std::strncmp(argv[i], "--seq=", 6) == 0) seq = std::atoll(argv[i] + 6);
    if (std::strncmp(argv[i], "--varlen-layouts=", 17) == 0) g_varlen_layouts = argv[i] + 17;
  }
  if (seq < 64 || seq > (int64_t{1} << 20)) {
    std::fprintf(stderr, "cuda_ops_bench: --seq must be between 64 and 1048576\n");
    return 2;
  }
  auto want = [&](const char* group) { return only.empty() || only == group; };
  cudaDeviceProp prop{};
  MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  try {
    if (want("gemm")) bench_gemm();
    if (want("attn")) {
      bench_attention(4, 32, 8, 2048, 64);    // llama-1.5b
      bench_attention(4, 32, 32, 2048, 64);   // the same as multi-head
      bench_attention(1, 16, 4, 4096, 128);   // llama-8b with TP=2 (one rank's heads)
      bench_attention(2, 16, 16, 2048, 128);
    }
    if (want("mem")) bench_memory_bound();
    if (only == "varlen") {
      for (int64_t S : {4096, 8192, 32768}) {
        bench_varlen_attention(S, "uniform", 256, 4096);
        bench_varlen_attention(S, "long", 0, 0);
      }
      bench_varlen_attention(32768, "uniform", 64, 1024);  // many short documents
    }
    if (only == "fp8cast") mt::bench::bench_fp8_casts();
    if (only == "fp8gemm") mt::bench::bench_fp8_gemms();
    if (only == "gemvchain") mt::bench::bench_gemv_chain();
    if (only == "longattn") {
      bench_attention(1, 32, 8, seq, 64);  // llama-1.5b's heads, one long sequence
      bench_packed_attention(32, 8, seq, 64, 4096);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench failed: %s\n", e.what());
    return 1;
  }
  std::printf("\n%-28s %-40s %10s %10s\n", "op", "shape", "ms", "rate");
  for (const Row& r : g_rows)
    std::printf("%-28s %-40s %10.4f %10.1f %s\n", r.op.c_str(), r.shape.c_str(), r.ms, r.rate, r.unit);
  return 0;
}
