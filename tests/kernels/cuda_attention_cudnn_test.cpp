// cuDNN fused flash attention (kernels/cuda/attention_cudnn.h) against the CPU reference (fp32 on
// the bf16-rounded inputs, the tolerances of cuda_attention_test.cpp) and against our own flash
// kernels; the deterministic backward run twice; and the --attention-backend policy (auto falls
// back for dropout, fused errors, flash never touches cuDNN).
//
// Every failure prints cuDNN's reason. For cuDNN's own log, rerun with
//   CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr ./test_kernels --gtest_filter='GpuCudnn*'
#ifdef MT_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rel_l2;
using test::max_abs_diff;

#define MT_REQUIRE_CUDNN()                                                                               \
  do {                                                                                                   \
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";                                                     \
    if (!cudnn_attention_compiled()) GTEST_SKIP() << "this build has no cuDNN (see CMake's cuDNN line)"; \
  } while (0)

ops::AttentionShape params(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal, float drop = 0.f) {
  ops::AttentionShape p{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = causal;
  p.dropout_p = drop;
  p.seed = 0x1234567890abcdefull;
  p.offset = 977;
  return p;
}

std::string str(const ops::AttentionShape& p) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%lld Hq=%lld Hkv=%lld S=%lld D=%lld causal=%d drop=%.2f", static_cast<long long>(p.B),
                static_cast<long long>(p.Hq), static_cast<long long>(p.Hkv), static_cast<long long>(p.S),
                static_cast<long long>(p.D), p.causal ? 1 : 0, p.dropout_p);
  return b;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs make_inputs(const ops::AttentionShape& p, uint64_t seed) {
  const size_t nq = p.B * p.Hq * p.S * p.D, nk = p.B * p.Hkv * p.S * p.D;
  Inputs in{random_vec<float>(nq, seed, -2, 2), random_vec<float>(nk, seed + 1, -2, 2),
            random_vec<float>(nk, seed + 2, -1, 1), random_vec<float>(nq, seed + 3, -1, 1)};
  for (auto* v : {&in.q, &in.k, &in.v, &in.dout})
    for (auto& x : *v) x = round_bf16(x);  // the reference sees exactly the GPU's inputs
  return in;
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result cpu_reference(const ops::AttentionShape& p, const Inputs& in) {
  Result r{std::vector<float>(in.q.size()), std::vector<float>(p.B * p.Hq * p.S), std::vector<float>(in.q.size()),
           std::vector<float>(in.k.size()), std::vector<float>(in.k.size())};
  cpu::attention_forward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  cpu::attention_backward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                          r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

enum class Path { Cudnn, Entry };  // cuDNN called directly, or the entry points under the current backend

Result gpu_run(const ops::AttentionShape& p, const Inputs& in, Path path, bool deterministic = true) {
  DeviceBuffer<bf16> q(in.q), k(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<bf16> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
  DeviceBuffer<float> lse(p.B * p.Hq * p.S);
  // Poison outputs: every element must be written.
  out.fill_bytes(0xff), dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff), lse.fill_bytes(0xff);
  if (path == Path::Cudnn) {
    cudnn_attention_forward(p, q.get(), k, v, out, lse, nullptr);
    cudnn_attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr, deterministic);
  } else {
    attention_forward(p, q.get(), k, v, out, lse, nullptr);
    attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr);
  }
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.download(), lse.download(), dq.download(), dk.download(), dv.download()};
}

Result flash_run(const ops::AttentionShape& p, const Inputs& in) {
  const AttentionBackend prev = attention_backend();
  set_attention_backend(AttentionBackend::Flash);
  Result r = gpu_run(p, in, Path::Entry);
  set_attention_backend(prev);
  return r;
}

void expect_close(const char* what, const ops::AttentionShape& p, const Result& got, const Result& want, double tol,
                  double lse_tol) {
  const double eo = rel_l2(got.out, want.out), eq = rel_l2(got.dq, want.dq), ek = rel_l2(got.dk, want.dk),
               ev = rel_l2(got.dv, want.dv), el = max_abs_diff(got.lse, want.lse);
  std::printf("[%s] %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", what, str(p).c_str(), eo, el, eq, ek, ev);
  EXPECT_LT(eo, tol) << what << " out, " << str(p);
  EXPECT_LT(el, lse_tol) << what << " lse, " << str(p);
  EXPECT_LT(eq, tol) << what << " dq, " << str(p);
  EXPECT_LT(ek, tol) << what << " dk, " << str(p);
  EXPECT_LT(ev, tol) << what << " dv, " << str(p);
}

// Builds both graphs; on failure reports cuDNN's reason and returns false.
bool prepared(const ops::AttentionShape& p, bool deterministic = true) {
  std::string why;
  if (!cudnn_attention_supported(p, &why)) {
    ADD_FAILURE() << "cudnn_attention_supported(" << str(p) << ") is false: " << why;
    return false;
  }
  const std::string fwd = cudnn_attention_prepare(p, false), bwd = cudnn_attention_prepare(p, true, deterministic);
  EXPECT_EQ(fwd, "") << "forward graph for " << str(p);
  EXPECT_EQ(bwd, "") << "backward graph (deterministic=" << deterministic << ") for " << str(p);
  return fwd.empty() && bwd.empty();
}

class GpuCudnnAttention : public ::testing::Test {
 protected:
  void TearDown() override { set_attention_backend(AttentionBackend::Auto); }
};

TEST_F(GpuCudnnAttention, Available) {
  MT_REQUIRE_CUDNN();
  std::printf("cuDNN runtime version %ld\n", cudnn_runtime_version());
  std::string why;
  const ops::AttentionShape p = params(1, 8, 2, 256, 64, true);
  EXPECT_TRUE(cudnn_attention_supported(p, &why)) << why;
  EXPECT_FALSE(cudnn_attention_supported(params(1, 8, 2, 256, 64, true, 0.1f), &why));
  EXPECT_NE(why.find("dropout"), std::string::npos) << why;
  EXPECT_FALSE(cudnn_attention_supported(params(1, 8, 2, 256, 72 + 4, true), &why));  // D % 8 != 0
}

TEST_F(GpuCudnnAttention, MatchesCpuAndFlash) {
  MT_REQUIRE_CUDNN();
  const ops::AttentionShape cases[] = {
      params(2, 8, 2, 128, 64, true),   params(1, 8, 2, 256, 128, true),  params(2, 4, 4, 256, 64, true),
      params(1, 4, 4, 128, 128, false), params(2, 8, 2, 256, 64, false),  params(1, 4, 1, 512, 64, true),
      params(1, 8, 2, 100, 64, true),   params(1, 4, 4, 100, 128, false), params(1, 8, 2, 192, 64, true),
  };
  uint64_t seed = 300;
  for (const ops::AttentionShape& p : cases) {
    std::string why;
    if (!cudnn_attention_supported(p, &why)) {
      // The only restriction we accept for these shapes: old cuDNN and S % 128 != 0.
      std::printf("[cudnn] %s unsupported: %s\n", str(p).c_str(), why.c_str());
      EXPECT_TRUE(p.S % 128 != 0 && cudnn_runtime_version() <= 91500) << str(p) << ": " << why;
      set_attention_backend(AttentionBackend::Fused);
      const Inputs in = make_inputs(p, seed += 10);
      EXPECT_THROW(gpu_run(p, in, Path::Entry), Error) << "fused must refuse " << str(p);
      set_attention_backend(AttentionBackend::Auto);
      continue;
    }
    if (!prepared(p)) continue;
    const Inputs in = make_inputs(p, seed += 10);
    const Result ref = cpu_reference(p, in), cudnn = gpu_run(p, in, Path::Cudnn), flash = flash_run(p, in);
    expect_close("cudnn-vs-cpu", p, cudnn, ref, 2e-2, 2e-2);
    expect_close("cudnn-vs-flash", p, cudnn, flash, 2e-2, 2e-2);
  }
}

TEST_F(GpuCudnnAttention, BackwardDeterministic) {
  MT_REQUIRE_CUDNN();
  for (const ops::AttentionShape& p : {params(2, 8, 2, 512, 64, true), params(1, 4, 4, 256, 128, false)}) {
    if (!prepared(p)) continue;
    const Inputs in = make_inputs(p, 99);
    const Result a = gpu_run(p, in, Path::Cudnn), b = gpu_run(p, in, Path::Cudnn);
    EXPECT_TRUE(test::bit_equal(a.out, b.out)) << str(p);
    EXPECT_TRUE(test::bit_equal(a.lse, b.lse)) << str(p);
    EXPECT_TRUE(test::bit_equal(a.dq, b.dq)) << str(p);
    EXPECT_TRUE(test::bit_equal(a.dk, b.dk)) << str(p);
    EXPECT_TRUE(test::bit_equal(a.dv, b.dv)) << str(p);
  }
}

// The faster dQ-atomics backward (--nondeterministic-attention): only checked for accuracy.
TEST_F(GpuCudnnAttention, NondeterministicBackwardMatchesCpu) {
  MT_REQUIRE_CUDNN();
  const ops::AttentionShape p = params(2, 8, 2, 256, 64, true);
  if (!prepared(p, false)) return;
  const Inputs in = make_inputs(p, 7);
  expect_close("cudnn-nondet-vs-cpu", p, gpu_run(p, in, Path::Cudnn, false), cpu_reference(p, in), 2e-2, 2e-2);
}

TEST_F(GpuCudnnAttention, BackendSelection) {
  MT_REQUIRE_CUDNN();
  const ops::AttentionShape p = params(1, 8, 2, 256, 64, true);
  if (!prepared(p)) return;
  const Inputs in = make_inputs(p, 21);
  const Result direct = gpu_run(p, in, Path::Cudnn), flash = flash_run(p, in);
  set_attention_backend(AttentionBackend::Fused);
  const Result fused = gpu_run(p, in, Path::Entry);
  set_attention_backend(AttentionBackend::Auto);
  const Result automatic = gpu_run(p, in, Path::Entry);
  for (const Result* r : {&fused, &automatic}) {  // both went through cuDNN
    EXPECT_TRUE(test::bit_equal(r->out, direct.out));
    EXPECT_TRUE(test::bit_equal(r->dq, direct.dq));
    EXPECT_TRUE(test::bit_equal(r->dk, direct.dk));
  }
  // ... and flash did not: the two implementations round differently somewhere.
  EXPECT_FALSE(test::bit_equal(flash.dq, direct.dq) && test::bit_equal(flash.out, direct.out));
}

TEST_F(GpuCudnnAttention, AutoFallsBackForDropout) {
  if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  const ops::AttentionShape p = params(1, 4, 2, 256, 64, true, 0.1f);
  const Inputs in = make_inputs(p, 5);
  const Result flash = flash_run(p, in);
  set_attention_backend(AttentionBackend::Auto);
  const void* ptrs[] = {nullptr};
  EXPECT_FALSE(attention_use_cudnn(p, false, ptrs, 1));
  EXPECT_FALSE(attention_use_cudnn(p, true, ptrs, 1));
  const Result automatic = gpu_run(p, in, Path::Entry);
  EXPECT_TRUE(test::bit_equal(automatic.out, flash.out));  // the same kernels, the same dropout mask
  EXPECT_TRUE(test::bit_equal(automatic.dq, flash.dq));
  set_attention_backend(AttentionBackend::Fused);
  try {
    gpu_run(p, in, Path::Entry);
    ADD_FAILURE() << "fused must refuse dropout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dropout"), std::string::npos) << e.what();
  }
}

// No GPU needed: the names Megatron accepts, and ours.
TEST(AttentionBackendNames, Parse) {
  EXPECT_EQ(attention_backend_from_name("auto"), AttentionBackend::Auto);
  EXPECT_EQ(attention_backend_from_name("flash"), AttentionBackend::Flash);
  EXPECT_EQ(attention_backend_from_name("fused"), AttentionBackend::Fused);
  EXPECT_THROW(attention_backend_from_name("unfused"), Error);
  EXPECT_THROW(attention_backend_from_name("local"), Error);
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
