// cuda_ops_bench --only=fp8cast and --only=fp8gemm (issue #18): the FP8 tensorwise recipe's own
// kernels at llama-1.5b's shapes (micro-batch 4 x 2048 = 8192 rows, hidden 2048, qkv 3072, FFN
// 8192), through the ops the model calls (ops::gpu, on the context's compute stream).
//
// fp8cast: every memory-bound kernel a tensorwise step runs for its casts, in GB/s (bytes read +
// written once each) and as a percentage of the measured device-to-device copy rate, so that the
// kernels far below it stand out; then their sum per step in the default path's mix (per layer
// and micro-batch as docs/fp8_tensorwise_accounting.md counts it, x 16 layers x 8 micro-batches).
// The casts and transposes run with each vector kernel (fp8_cast_kernel.h; "_smem": the
// shared-memory tiles the lane blocks replaced), so one call says which to keep; the producers
// that find an amax for the casts (RMSNorm, SwiGLU both ways) run with and without it.
// Inputs and outputs rotate over sets of >= 128 MiB together, so the L2 serves no repeated reads.
//
// fp8gemm: each layer's forward (fast accumulation, residual C where the model adds one), data
// gradient (E5M2 x E4M3) and weight gradient (fp32, accumulated in place), cuBLASLt autotuning off
// (the heuristic's first choice) and on; the first tuned calls are timed apart.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/fp8_cast_kernel.h"
#include "kernels/cuda/fp8_lt.h"
#include "kernels/device.h"
#include "kernels/fp8_codes.h"
#include "kernels/op_backends.h"
#include "ops_bench.h"

namespace mt::bench {

namespace {

namespace g = ops::gpu;

constexpr int64_t kRows = 8192, kHidden = 2048, kQkv = 3072, kFfn = 8192;
constexpr int kLayers = 16, kMicroBatches = 8;
constexpr double kMiB = 1024.0 * 1024.0;

cudaStream_t stream() { return cuda::compute_stream(); }

Tensor random_bf16(int64_t r, int64_t c, uint64_t seed) {
  Tensor t = Tensor::empty({r, c}, DType::BF16, Device::CUDA);
  fill_uniform_bf16(t.raw(), r * c, seed, -2.f, 2.f, stream());
  return t;
}
Tensor u8(int64_t r, int64_t c) { return Tensor::empty({r, c}, DType::U8, Device::CUDA); }
Tensor scalar(float v) { return Tensor::from_vector(std::vector<float>{v}, {1}).to_device(Device::CUDA); }

std::string dims(int64_t r, int64_t c) { return std::to_string(r) + "x" + std::to_string(c); }

// How many rotating sets keep `bytes` per set out of the L2 (>= 128 MiB together, 2 to 8).
int sets_for(double bytes) { return std::clamp(static_cast<int>(128 * kMiB / bytes) + 1, 2, 8); }

int iters() { return quick() ? 5 : 20; }

// The rate of a plain device-to-device copy of `bytes` (read + written), GB/s.
double copy_rate(size_t bytes) {
  const int n = sets_for(static_cast<double>(bytes));
  std::vector<Tensor> src, dst;
  for (int i = 0; i < n; ++i) {
    src.push_back(Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA));
    dst.push_back(Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA));
  }
  const double ms = time_ms(
      [&](int i) {
        MT_CUDA_CHECK(cudaMemcpyAsync(dst[i % n].raw(), src[i % n].raw(), bytes, cudaMemcpyDeviceToDevice, stream()));
      },
      iters(), 5, stream());
  const double rate = 2.0 * static_cast<double>(bytes) / ms * 1e-6;
  report("copy_d2d", std::to_string(static_cast<int64_t>(bytes / kMiB)) + " MiB", ms, rate, "GB/s");
  return rate;
}

// A kernel's ms per call with each vector kernel (the amax pass has one: both the same).
struct Ms {
  double lanes = 0, smem = 0;
  Ms operator+(const Ms& o) const { return {lanes + o.lanes, smem + o.smem}; }
  Ms operator*(double k) const { return {lanes * k, smem * k}; }
};

struct CastBench {
  double peak = 0;  // the copy rate the kernels are compared with
  const Tensor amax = scalar(2.f);  // the inputs' range: a cast's scale as in training
  Tensor scale = scalar(1.f), used = scalar(1.f), used_inv = scalar(1.f);
  Tensor saturated = Tensor::zeros({1}, DType::I64, Device::CUDA);
  Tensor scratch_amax = scalar(0.f);

  // Times f(set) over the rotating sets and reports; returns ms per call.
  double run(const std::string& op, const std::string& shape, double bytes, int sets,
             const std::function<void(int)>& f) const {
    const double ms = time_ms([&](int i) { f(i % sets); }, iters(), 5, stream());
    const double rate = bytes / ms * 1e-6;
    char extra[64];
    std::snprintf(extra, sizeof extra, ",\"pct_of_copy\":%.1f", 100.0 * rate / peak);
    report(op, shape, ms, rate, "GB/s", extra);
    return ms;
  }
  // The same with each vector kernel (fp8_cast_kernel.h): the lane blocks as `op`, the
  // shared-memory tiles as op + "_smem".
  Ms run_both(const std::string& op, const std::string& shape, double bytes, int sets,
              const std::function<void(int)>& f) const {
    Ms ms;
    ms.lanes = run(op, shape, bytes, sets, f);
    g::set_fp8_cast_smem_tiles(true);
    ms.smem = run(op + "_smem", shape, bytes, sets, f);
    g::set_fp8_cast_smem_tiles(false);
    return ms;
  }

  // max |x| of a bf16 [r, c] (fp8_amax: its memset and the reduction).
  Ms amax_pass(int64_t r, int64_t c) {
    const int n = sets_for(2.0 * r * c);
    std::vector<Tensor> x;
    for (int i = 0; i < n; ++i) x.push_back(random_bf16(r, c, 100 + i));
    Tensor a = scalar(0.f);
    const double ms = run("fp8_amax", dims(r, c) + " bf16", 2.0 * r * c, n, [&](int s) { g::fp8_amax(x[s], a); });
    return {ms, ms};
  }

  // The tensorwise cast of a bf16 [r, c] with its scale from the amax (fp8_cast_transpose_current):
  // q and qt, q alone (a weight, the proj input), or (recast) qt alone with a given scale.
  enum class Out { Both, Q, Qt };
  Ms cast(int64_t r, int64_t c, Out out, const char* what) {
    const double io = 2.0 * r * c + (out == Out::Both ? 2.0 : 1.0) * r * c;
    const int n = sets_for(io);
    std::vector<Tensor> x, q, qt;
    for (int i = 0; i < n; ++i) {
      x.push_back(random_bf16(r, c, 200 + i));
      q.push_back(out == Out::Qt ? Tensor() : u8(r, c));
      qt.push_back(out == Out::Q ? Tensor() : u8(c, r));
    }
    const char* op = out == Out::Both ? "fp8_cast_q_qt" : out == Out::Q ? "fp8_cast_q" : "fp8_recast_qt";
    return run_both(op, dims(r, c) + " " + what, io, n, [&](int s) {
      Tensor* t = out == Out::Q ? nullptr : &qt[s];
      if (out == Out::Qt)
        g::fp8_cast_transpose(x[s], scale, Fp8Format::E4M3, q[s], t, scratch_amax, saturated);
      else
        g::fp8_cast_transpose_current(x[s], amax, Fp8Format::E4M3, scale, used, used_inv, q[s], t, saturated);
    });
  }

  // A weight's codes [r, c] transposed (the data gradient's operand, MT_FP8_WT_FROM_CODES).
  Ms transpose(int64_t r, int64_t c, const char* what) {
    const int n = sets_for(2.0 * r * c);
    std::vector<Tensor> q, qt;
    for (int i = 0; i < n; ++i) q.push_back(u8(r, c)), qt.push_back(u8(c, r));
    for (Tensor& t : q) MT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0x3c, static_cast<size_t>(r * c), stream()));
    return run_both("fp8_transpose_codes", dims(r, c) + " " + what, 2.0 * r * c, n,
                    [&](int s) { g::fp8_transpose_codes(q[s], qt[s]); });
  }

  // SwiGLU's fused casts (the delayed recipe's producers; tensorwise's opt-in gradient path):
  // h [R, 2F] -> codes of silu(gate) * up; dy [R, F] and h -> codes of dh [R, 2F]; dh's amax alone.
  void swiglu(int64_t R, int64_t F) {
    const int n = sets_for(2.0 * R * 2 * F);
    std::vector<Tensor> h, dy, q, qt, fq, fqt;
    for (int i = 0; i < n; ++i) {
      h.push_back(random_bf16(R, 2 * F, 300 + i));
      dy.push_back(random_bf16(R, F, 400 + i));
      q.push_back(u8(R, 2 * F));
      qt.push_back(u8(2 * F, R));
      fq.push_back(u8(R, F));
      fqt.push_back(u8(F, R));
    }
    Tensor a = scalar(0.f);
    run_both("fp8_swiglu_fwd_cast", dims(R, 2 * F) + " h -> q, qt", 4.0 * R * F + 2.0 * R * F, n,
        [&](int s) { g::swiglu_forward_fp8(h[s], scale, Fp8Format::E4M3, fq[s], &fqt[s], a, saturated); });
    run_both("fp8_swiglu_bwd_cast", dims(R, F) + " dy, h -> dh q, qt", 6.0 * R * F + 4.0 * R * F, n,
        [&](int s) { g::swiglu_backward_fp8(dy[s], h[s], scale, Fp8Format::E5M2, q[s], &qt[s], a, saturated); });
    run("fp8_swiglu_bwd_amax", dims(R, F) + " dy, h", 6.0 * R * F, n,
        [&](int s) { g::swiglu_backward_amax(dy[s], h[s], a); });
  }

  // The producers that find their output's amax for the next cast (tensorwise's fusion, model/
  // fp8.h), with and without it: what their per-warp same-address atomics cost, if anything.
  void producers(int64_t R, int64_t H, int64_t F) {
    const int nh = sets_for(4.0 * R * H), nf = sets_for(10.0 * R * F);
    std::vector<Tensor> x, h, dy;
    for (int i = 0; i < nh; ++i) x.push_back(random_bf16(R, H, 500 + i));
    for (int i = 0; i < nf; ++i) h.push_back(random_bf16(R, 2 * F, 600 + i)), dy.push_back(random_bf16(R, F, 700 + i));
    const Tensor w = random_bf16(1, H, 800).view({H});
    Tensor rstd = Tensor::empty({R}, DType::F32, Device::CUDA), a = scalar(0.f);
    for (const bool with : {false, true}) {
      Tensor* am = with ? &a : nullptr;
      const std::string tag = with ? "_amax" : "";
      run("rmsnorm_fwd" + tag, dims(R, H) + " bf16", 4.0 * R * H, nh,
          [&](int s) { g::rmsnorm_forward(x[s], w, 1e-5f, rstd, am); });
      run("swiglu_fwd" + tag, dims(R, 2 * F) + " bf16", 6.0 * R * F, nf, [&](int s) { g::swiglu_forward(h[s], am); });
      run("swiglu_bwd" + tag, dims(R, F) + " bf16", 10.0 * R * F, nf,
          [&](int s) { g::swiglu_backward(dy[s], h[s], am); });
    }
  }
};

}  // namespace

void bench_fp8_casts() {
  ops::GpuContext ctx(0);
  CastBench b;
  copy_rate(static_cast<size_t>(2 * kRows * kHidden));  // 32 MiB: a small cast's size
  b.peak = copy_rate(static_cast<size_t>(2 * kRows * 2 * kFfn));
  using Out = CastBench::Out;
  // Each kernel once per shape the step runs it at; the default path's per-layer mix is summed
  // from these (ms) below.
  const Ms amax_h = b.amax_pass(kRows, kHidden), amax_qkv = b.amax_pass(kRows, kQkv);
  b.amax_pass(2 * kFfn, kHidden);  // the largest weight (fc1), once per step
  const Ms both_h = b.cast(kRows, kHidden, Out::Both, "qkv/fc1 input, fc2/proj dy");
  const Ms both_qkv = b.cast(kRows, kQkv, Out::Both, "qkv dy");
  const Ms both_f = b.cast(kRows, kFfn, Out::Both, "fc2 input");
  const Ms both_2f = b.cast(kRows, 2 * kFfn, Out::Both, "fc1 dh");
  const Ms q_h = b.cast(kRows, kHidden, Out::Q, "proj input");
  const Ms qt_h = b.cast(kRows, kHidden, Out::Qt, "proj x^T recast");
  b.cast(2 * kFfn, kHidden, Out::Q, "fc1 weight");
  b.cast(kHidden, kFfn, Out::Q, "fc2 weight");
  const Ms t_qkv = b.transpose(kQkv, kHidden, "qkv w"), t_proj = b.transpose(kHidden, kHidden, "proj w");
  const Ms t_fc1 = b.transpose(2 * kFfn, kHidden, "fc1 w"), t_fc2 = b.transpose(kHidden, kFfn, "fc2 w");
  b.swiglu(kRows, kFfn);
  b.producers(kRows, kHidden, kFfn);
  // One layer's casts in one micro-batch, the default tensorwise path (producer amaxes in the norms
  // and SwiGLU, so the amax passes are those of proj's input and of three gradients).
  const Ms fwd = both_h * 2 + (amax_h + q_h) + both_f;
  const Ms bwd = (amax_h + both_h) + t_fc2 + both_2f + t_fc1 + (amax_h + both_h) + t_proj + qt_h +
                 (amax_qkv + both_qkv) + t_qkv;
  for (const bool smem : {false, true}) {
    const double f = smem ? fwd.smem : fwd.lanes, bw = smem ? bwd.smem : bwd.lanes;
    char extra[96];
    std::snprintf(extra, sizeof extra, ",\"layer_fwd_ms\":%.4f,\"layer_bwd_ms\":%.4f", f, bw);
    // ms: per step; the rate slot: ms per layer and micro-batch.
    report(smem ? "fp8_casts_step_estimate_smem" : "fp8_casts_step_estimate",
           "16 layers x 8 micro-batches, kernels only", (f + bw) * kLayers * kMicroBatches, f + bw, "layer_ms", extra);
  }
}

void bench_fp8_gemms() {
  ops::GpuContext ctx(0);
  struct S {
    int64_t in, out;
    const char* what;
    bool residual;
  };
  const S shapes[] = {{kHidden, kQkv, "qkv", false},
                      {kHidden, kHidden, "proj", true},
                      {kHidden, 2 * kFfn, "fc1", false},
                      {kFfn, kHidden, "fc2", true}};
  // Codes of a random bf16 [r, c] (format f) and their scale_inv: what the casts hand the GEMMs.
  auto codes = [](int64_t r, int64_t c, Fp8Format f, uint64_t seed, Tensor& inv) {
    Tensor q = u8(r, c), none, sat = Tensor::zeros({1}, DType::I64, Device::CUDA), used = scalar(1.f);
    Tensor scale = scalar(1.f), a = scalar(0.f);
    inv = scalar(1.f);
    const Tensor x = random_bf16(r, c, seed);
    g::fp8_amax(x, a);
    g::fp8_cast_transpose_current(x, a, f, scale, used, inv, q, nullptr, sat);
    return q;
  };
  const Fp8Format e4 = Fp8Format::E4M3, e5 = Fp8Format::E5M2;
  double sum[2] = {0, 0}, tune_ms = 0, flop_sum = 0;
  for (const S& s : shapes) {
    Tensor sx, sw, swt, sg, sgt, sxt;
    const Tensor x = codes(kRows, s.in, e4, 1, sx), w = codes(s.out, s.in, e4, 2, sw);
    const Tensor wt = codes(s.in, s.out, e4, 3, swt), dy = codes(kRows, s.out, e5, 4, sg);
    const Tensor dyt = codes(s.out, kRows, e5, 5, sgt), xt = codes(s.in, kRows, e4, 6, sxt);
    const Tensor res = random_bf16(kRows, s.out, 7);
    Tensor y = Tensor::empty({kRows, s.out}, DType::BF16, Device::CUDA);
    Tensor dx = Tensor::empty({kRows, s.in}, DType::BF16, Device::CUDA);
    Tensor dw = Tensor::zeros({s.out, s.in}, DType::F32, Device::CUDA);
    const double flop = 2.0 * kRows * s.in * s.out;
    const std::string shape = dims(kRows, s.in) + "->" + std::to_string(s.out) + " " + s.what;
    const std::function<void(int)> calls[3] = {
        [&](int) { g::fp8_gemm_into(x, e4, sx, w, e4, sw, s.residual ? &res : nullptr, y, true); },
        [&](int) { g::fp8_gemm_into(dy, e5, sg, wt, e4, swt, nullptr, dx, false); },
        [&](int) { g::fp8_gemm_into(dyt, e5, sgt, xt, e4, sxt, &dw, dw, false); }};
    const char* names[3] = {"fp8_gemm_fwd", "fp8_gemm_dgrad", "fp8_gemm_wgrad_f32acc"};
    for (int k = 0; k < 3; ++k)
      for (int on = 0; on < 2; ++on) {
        g::set_fp8_gemm_tuning(on == 1);
        if (on) {  // the first call times the candidates: apart from the steady state
          MT_CUDA_CHECK(cudaDeviceSynchronize());
          const auto t0 = std::chrono::steady_clock::now();
          calls[k](0);
          MT_CUDA_CHECK(cudaDeviceSynchronize());
          tune_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        }
        const double ms = time_ms(calls[k], iters(), 5, stream());
        report(std::string(names[k]) + (on ? "_tuned" : ""), shape, ms, flop / ms * 1e-9, "TFLOP/s");
        sum[on] += kLayers * ms;
      }
    flop_sum += kLayers * 3 * flop;
  }
  const std::string all = "llama-1.5b micro-batch, 16 layers (FP8 block GEMMs)";
  report("fp8_gemm_sum", all, sum[0], flop_sum / sum[0] * 1e-9, "TFLOP/s");
  report("fp8_gemm_sum_tuned", all, sum[1], flop_sum / sum[1] * 1e-9, "TFLOP/s");
  const g::Fp8TuneStats st = g::fp8_gemm_tune_stats();
  std::printf("{\"op\":\"fp8_gemm_tuning\",\"plans\":%d,\"tuned\":%d,\"first_calls_ms\":%.1f}\n", st.plans, st.tuned,
              tune_ms);
  g::set_fp8_gemm_tuning(true);
}

}  // namespace mt::bench
