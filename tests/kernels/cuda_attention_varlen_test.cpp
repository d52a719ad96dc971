// Packed documents on cuDNN (kernels/cuda/attention_cudnn.h, the ragged graph): every document
// of a batch one cuDNN sequence, in both memory layouts (Heads: in place; Tokens: token-major
// copies), against the CPU reference (fp32 on the bf16-rounded inputs) and against our ranged
// tensor-core kernels; its deterministic backward run twice; the workspace limit; and the
// --attention-backend policy for packed documents. Host-only checks (buckets, which calls are
// eligible) run without a GPU.
//
// Every failure prints cuDNN's reason. For cuDNN's own log, rerun with
//   CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr ./test_kernels --gtest_filter='GpuCudnnVarlen*'
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

using test::rel_l2;

// A packed batch: B samples of S tokens, cut into documents by cu. p() is the call's shape with
// cu as both the host and the device copy (gpu_run swaps in a device one).
struct Packed {
  ops::AttentionShape base;
  std::vector<int32_t> cu;
  ops::AttentionShape p() const {
    ops::AttentionShape s = base;
    s.num_segments = static_cast<int64_t>(cu.size()) - 1;
    s.cu_seqlens = s.cu_seqlens_host = cu.data();
    return s;
  }
};

Packed packed(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal, std::vector<int32_t> cu) {
  Packed k{ops::AttentionShape{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))}, std::move(cu)};
  k.base.causal = causal;
  return k;
}

std::string str(const Packed& k) {
  const ops::AttentionShape& b = k.base;
  std::string s = fmt::format("B={} Hq={} Hkv={} S={} D={} causal={} docs", b.B, b.Hq, b.Hkv, b.S, b.D, b.causal ? 1 : 0);
  for (size_t i = 1; i < k.cu.size(); ++i) s += fmt::format(" {}", k.cu[i] - k.cu[i - 1]);
  return s;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs make_inputs(const ops::AttentionShape& p, uint64_t seed) {
  const size_t nq = p.B * p.Hq * p.S * p.D, nk = p.B * p.Hkv * p.S * p.D;
  return {test::rounded(test::random_vec<float>(nq, seed, -2, 2)),
          test::rounded(test::random_vec<float>(nk, seed + 1, -2, 2)),
          test::rounded(test::random_vec<float>(nk, seed + 2, -1, 1)),
          test::rounded(test::random_vec<float>(nq, seed + 3, -1, 1))};
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

Result cpu_reference(const Packed& k, const Inputs& in) {
  const ops::AttentionShape p = k.p();
  Result r{std::vector<float>(in.q.size()), std::vector<float>(p.B * p.Hq * p.S), std::vector<float>(in.q.size()),
           std::vector<float>(in.k.size()), std::vector<float>(in.k.size())};
  cpu::attention_forward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  cpu::attention_backward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                          r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

// Cudnn: the ragged graph called directly. Entry: attention_forward/backward under `backend`.
enum class Path { Cudnn, Entry };

Result gpu_run(const Packed& k, const Inputs& in, Path path, AttentionBackend backend = AttentionBackend::Auto) {
  DeviceBuffer<int32_t> dcu(k.cu);
  ops::AttentionShape p = k.p();
  p.cu_seqlens = dcu.get();
  DeviceBuffer<bf16> q(in.q), kk(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<bf16> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
  DeviceBuffer<float> lse(p.B * p.Hq * p.S);
  // Poison outputs: every element must be written (every row belongs to one document).
  out.fill_bytes(0xff), dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff), lse.fill_bytes(0xff);
  const AttentionBackend prev = attention_backend();
  set_attention_backend(backend);
  try {
    if (path == Path::Cudnn) {
      cudnn_attention_varlen_forward(p, q.get(), kk, v, out, lse, nullptr);
      cudnn_attention_varlen_backward(p, q.get(), kk, v, out, lse, dout, dq, dk, dv, nullptr);
    } else {
      attention_forward(p, q.get(), kk, v, out, lse, nullptr);
      attention_backward(p, q.get(), kk, v, out, lse, dout, dq, dk, dv, nullptr);
    }
    MT_CUDA_CHECK(cudaDeviceSynchronize());
  } catch (...) {
    set_attention_backend(prev);
    throw;
  }
  set_attention_backend(prev);
  auto f = [](const auto& x) { return std::vector<float>(x.begin(), x.end()); };
  return {f(out.download()), lse.download(), f(dq.download()), f(dk.download()), f(dv.download())};
}

void expect_close(const char* what, const Packed& k, const Result& got, const Result& want, double tol) {
  const double eo = rel_l2(got.out, want.out), el = rel_l2(got.lse, want.lse), eq = rel_l2(got.dq, want.dq),
               ek = rel_l2(got.dk, want.dk), ev = rel_l2(got.dv, want.dv);
  std::printf("[%s] %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", what, str(k).c_str(), eo, el, eq, ek, ev);
  EXPECT_LT(eo, tol) << what << " out, " << str(k);
  EXPECT_LT(el, tol) << what << " lse, " << str(k);
  EXPECT_LT(eq, tol) << what << " dq, " << str(k);
  EXPECT_LT(ek, tol) << what << " dk, " << str(k);
  EXPECT_LT(ev, tol) << what << " dv, " << str(k);
}

bool bits_equal(const Result& a, const Result& b) {
  return test::bit_equal(a.out, b.out) && test::bit_equal(a.lse, b.lse) && test::bit_equal(a.dq, b.dq) &&
         test::bit_equal(a.dk, b.dk) && test::bit_equal(a.dv, b.dv);
}

// Both graphs build under the current layout; else reports cuDNN's reason (a failure unless
// `optional`: the Heads layout may be refused by a cuDNN version, and Tokens then serves).
bool prepared(const Packed& k, bool optional = false) {
  std::string why;
  if (!cudnn_varlen_supported(k.p(), &why)) {
    ADD_FAILURE() << "cudnn_varlen_supported(" << str(k) << ") is false: " << why;
    return false;
  }
  const std::string fwd = cudnn_attention_varlen_prepare(k.p(), false),
                    bwd = cudnn_attention_varlen_prepare(k.p(), true);
  if (optional && !(fwd.empty() && bwd.empty())) {
    std::printf("[varlen %s] %s: not built (fwd: %s) (bwd: %s)\n", varlen_layout_name(varlen_layout()),
                str(k).c_str(), fwd.c_str(), bwd.c_str());
    return false;
  }
  EXPECT_EQ(fwd, "") << "ragged forward graph for " << str(k);
  EXPECT_EQ(bwd, "") << "ragged backward graph for " << str(k);
  return fwd.empty() && bwd.empty();
}

// A test may force one layout; the process default comes back after it.
class GpuCudnnVarlen : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = varlen_layout(); }
  void TearDown() override { set_varlen_layout(saved_); }
  VarlenLayout saved_ = VarlenLayout::None;
};

#define MT_REQUIRE_CUDNN_VARLEN()                                                                        \
  do {                                                                                                   \
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";                                                     \
    if (!cudnn_attention_compiled()) GTEST_SKIP() << "this build has no cuDNN (see CMake's cuDNN line)"; \
    test::gpu();                                                                                         \
  } while (0)

// Documents of 1 token, documents crossing cuDNN's 128-row tiles, a bucket with unused slots
// (6 documents in 8), GQA and MHA, head dims 64 and 128, causal and not, one document per sample.
std::vector<Packed> cases() {
  return {packed(2, 4, 2, 384, 64, true, {0, 1, 130, 300, 384, 584, 768}),
          packed(1, 8, 2, 512, 64, true, {0, 64, 65, 200, 456, 512}),
          packed(1, 4, 4, 256, 128, true, {0, 17, 145, 256}),
          packed(2, 4, 1, 256, 128, false, {0, 100, 256, 257, 512}),
          packed(2, 8, 2, 256, 64, true, {0, 256, 512})};
}

void matches_cpu_and_ranged(VarlenLayout layout) {
  set_varlen_layout(layout);
  const bool optional = layout == VarlenLayout::Heads;
  const std::string tag = std::string("varlen-") + varlen_layout_name(layout);
  uint64_t seed = 700;
  for (const Packed& k : cases()) {
    if (!prepared(k, optional)) continue;
    const Inputs in = make_inputs(k.base, seed += 10);
    const Result ref = cpu_reference(k, in), cudnn = gpu_run(k, in, Path::Cudnn),
                 ranged = gpu_run(k, in, Path::Entry, AttentionBackend::Flash);
    expect_close((tag + "-vs-cpu").c_str(), k, cudnn, ref, 2e-2);
    expect_close((tag + "-vs-ranged").c_str(), k, cudnn, ranged, 2e-2);
  }
}

// In place: may be refused by cuDNN (then printed, and the Tokens layout serves), never wrong.
TEST_F(GpuCudnnVarlen, HeadsLayoutMatchesCpuAndRangedKernels) {
  MT_REQUIRE_CUDNN_VARLEN();
  matches_cpu_and_ranged(VarlenLayout::Heads);
}

TEST_F(GpuCudnnVarlen, TokensLayoutMatchesCpuAndRangedKernels) {
  MT_REQUIRE_CUDNN_VARLEN();
  matches_cpu_and_ranged(VarlenLayout::Tokens);
}

TEST_F(GpuCudnnVarlen, BackwardDeterministic) {
  MT_REQUIRE_CUDNN_VARLEN();
  const Packed k = packed(2, 8, 2, 512, 64, true, {0, 300, 512, 513, 900, 1024});
  if (!prepared(k)) return;
  const Inputs in = make_inputs(k.base, 42);
  EXPECT_TRUE(bits_equal(gpu_run(k, in, Path::Cudnn), gpu_run(k, in, Path::Cudnn))) << str(k);
}

// Fused runs the ragged graph for packed documents, flash the ranged kernels, auto whichever
// varlen_auto_prefers_cudnn picks (the ranged kernels until the measured thresholds are set).
TEST_F(GpuCudnnVarlen, BackendSelection) {
  MT_REQUIRE_CUDNN_VARLEN();
  const Packed k = packed(1, 8, 2, 384, 64, true, {0, 200, 384});
  if (!prepared(k)) return;
  const Inputs in = make_inputs(k.base, 5);
  const Result cudnn = gpu_run(k, in, Path::Cudnn);
  const Result fused = gpu_run(k, in, Path::Entry, AttentionBackend::Fused);
  const Result flash = gpu_run(k, in, Path::Entry, AttentionBackend::Flash);
  const Result autob = gpu_run(k, in, Path::Entry, AttentionBackend::Auto);
  EXPECT_TRUE(bits_equal(fused, cudnn));
  EXPECT_FALSE(bits_equal(flash, cudnn)) << "the ranged kernels round differently from cuDNN";
  EXPECT_TRUE(bits_equal(autob, varlen_auto_prefers_cudnn(k.p()) ? cudnn : flash));
}

// The deterministic backward's workspace (about docs*Hq*S*S*2 bytes over the buckets) is held to
// MT_CUDNN_ATTN_WORKSPACE_LIMIT like the plain graph's: refused above it, named in the error.
TEST_F(GpuCudnnVarlen, WorkspaceLimit) {
  MT_REQUIRE_CUDNN_VARLEN();
  const Packed k = packed(1, 2, 1, 640, 64, true, {0, 333, 640});  // a shape no other test builds
  setenv("MT_CUDNN_ATTN_WORKSPACE_LIMIT", "4096", 1);
  const std::string fwd = cudnn_attention_varlen_prepare(k.p(), false),
                    bwd = cudnn_attention_varlen_prepare(k.p(), true);
  unsetenv("MT_CUDNN_ATTN_WORKSPACE_LIMIT");
  EXPECT_EQ(fwd, "");
  EXPECT_NE(bwd.find("workspace"), std::string::npos) << bwd;
  const Inputs in = make_inputs(k.base, 9);
  EXPECT_THROW(gpu_run(k, in, Path::Entry, AttentionBackend::Fused), Error);
}

// ---- host-only: buckets and eligibility (no GPU needed)

TEST(CudnnVarlenPolicy, Buckets) {
  const Packed k = packed(2, 4, 2, 1000, 64, true, {0, 10, 600, 1000, 1100, 2000});
  const VarlenBuckets vb = varlen_buckets(k.p());
  EXPECT_EQ(vb.docs, 8);
  EXPECT_EQ(vb.max_len, 1024);
  EXPECT_EQ(vb.real_docs, 5);
  EXPECT_EQ(vb.real_max_len, 900);
  EXPECT_DOUBLE_EQ(vb.mean_len, 400.0);
  EXPECT_EQ(varlen_buckets(packed(1, 4, 2, 64, 64, true, {0, 3, 64}).p()).max_len, 128);
}

TEST(CudnnVarlenPolicy, IneligibleCallsSayWhy) {
  auto why_not = [](const ops::AttentionShape& p) {
    std::string why;
    EXPECT_FALSE(cudnn_varlen_supported(p, &why));
    return why;
  };
  const Packed across = packed(2, 4, 2, 256, 64, true, {0, 100, 300, 512});  // a document across samples
  EXPECT_NE(why_not(across.p()).find("not inside one sample"), std::string::npos);
  const Packed k = packed(1, 4, 2, 256, 64, true, {0, 100, 256});
  ops::AttentionShape p = k.p();
  p.cu_seqlens_host = nullptr;
  EXPECT_NE(why_not(p).find("host copy"), std::string::npos);
  p = k.p();
  p.q_pos = 128;
  EXPECT_NE(why_not(p).find("context-parallel"), std::string::npos);
  p = k.p();
  p.dropout_p = 0.1f;
  EXPECT_NE(why_not(p).find("dropout"), std::string::npos);
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
