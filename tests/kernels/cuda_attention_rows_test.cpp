// The attention core with O and dO in linear_proj's row layout (ops::attention_forward_rows) on the
// GPU: through cuDNN with row strides (no copy) it must give what the heads layout + copies
// gives: forward O and lse bit-identical, the deterministic backward bit-identical run to run
// and equal to (or, should cuDNN pick another engine for the strides, within a tight tolerance
// of) the heads backward; both also against the CPU reference. Where cuDNN is not chosen
// (--attention-backend flash, dropout, fp16) the rows functions are the composition, bit for bit.
//
// Run on a GPU machine: ctest --test-dir build -L gpu -R AttentionRows, or
//   ./build/bin/test_kernels --gtest_filter='GpuAttentionRows*'
// For cuDNN's own reasons: CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr (see attention_cudnn.h).
#ifdef MT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt::ops {
namespace {

using cuda::AttentionBackend;
using cuda::AttnLayout;
using test::bit_equal;
using test::random_vec;
using test::rel_l2;

ops::AttentionShape params(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal, float drop = 0.f) {
  ops::AttentionShape p{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = causal;
  p.dropout_p = drop;
  p.seed = 0x5eed;
  p.offset = 31;
  return p;
}

std::string str(const ops::AttentionShape& p) {
  char b[160];
  std::snprintf(b, sizeof b, "B=%lld Hq=%lld Hkv=%lld S=%lld D=%lld causal=%d drop=%.2f", static_cast<long long>(p.B),
                static_cast<long long>(p.Hq), static_cast<long long>(p.Hkv), static_cast<long long>(p.S),
                static_cast<long long>(p.D), p.causal ? 1 : 0, p.dropout_p);
  return b;
}

// Host values (already rounded to `dt`) and their device tensor.
struct Input {
  std::vector<float> host;
  Tensor dev;
};
Input input(const Shape& s, uint64_t seed, DType dt, double lo = -2, double hi = 2) {
  std::vector<float> h = random_vec<float>(static_cast<size_t>(shape_numel(s)), seed, lo, hi);
  for (float& x : h) x = dt == DType::F16 ? round_f16(x) : round_bf16(x);
  return {h, Tensor::from_vector(h, s).to(dt).to_device(Device::CUDA)};
}
std::vector<float> host(const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32).to_vector(); }

// Rows [S*B, H*D] -> heads [B, H, S, D] on the host: the layout the CPU reference uses.
std::vector<float> rows_to_heads_host(const std::vector<float>& r, const ops::AttentionShape& p) {
  std::vector<float> h(r.size());
  for (int64_t s = 0; s < p.S; ++s)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hd = 0; hd < p.Hq; ++hd)
        for (int64_t d = 0; d < p.D; ++d)
          h[((b * p.Hq + hd) * p.S + s) * p.D + d] = r[((s * p.B + b) * p.Hq + hd) * p.D + d];
  return h;
}

// Fills and frees a block of the pool, so that unwritten outputs allocated next read as NaN.
void poison_pool(int64_t bytes) {
  Tensor t = Tensor::empty({bytes / 4}, DType::I32, Device::CUDA);
  MT_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0xff, t.nbytes(), static_cast<cudaStream_t>(test::gpu().compute_stream())));
}

struct Case {
  ops::AttentionShape p;
  Input q, k, v, dout_rows;
};
Case make_case(const ops::AttentionShape& p, uint64_t seed, DType dt = DType::BF16) {
  return {p, input({p.B, p.Hq, p.S, p.D}, seed, dt), input({p.B, p.Hkv, p.S, p.D}, seed + 1, dt),
          input({p.B, p.Hkv, p.S, p.D}, seed + 2, dt, -1, 1), input({p.S * p.B, p.Hq * p.D}, seed + 3, dt, -1, 1)};
}

struct Result {
  std::vector<float> out_rows, lse, dq, dk, dv;
};

// Through the rows entry points; `direct` (optional) says whether both ran without a copy.
Result run_rows(const Case& c, bool* direct = nullptr) {
  const ops::AttentionShape& p = c.p;
  Tensor out_rows, lse, dq, dk, dv;
  poison_pool(p.B * p.Hq * p.S * p.D * 8);  // room for the outputs and the workspaces
  if (direct) {
    *direct = attention_forward_rows_direct(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse);
    if (!*direct) attention_forward_rows(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse);
    const bool bwd =
        attention_backward_rows_direct(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse, c.dout_rows.dev, dq, dk, dv);
    if (!bwd) attention_backward_rows(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse, c.dout_rows.dev, dq, dk, dv);
    *direct = *direct && bwd;
  } else {
    attention_forward_rows(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse);
    attention_backward_rows(p, c.q.dev, c.k.dev, c.v.dev, out_rows, lse, c.dout_rows.dev, dq, dk, dv);
  }
  EXPECT_EQ(out_rows.shape(), (Shape{p.S * p.B, p.Hq * p.D}));
  return {host(out_rows), host(lse), host(dq), host(dk), host(dv)};
}

// The heads layout and the copies, as SelfAttention ran it before the rows entry points.
Result run_heads_plus_copies(const Case& c) {
  const ops::AttentionShape& p = c.p;
  Tensor out, lse, dq, dk, dv;
  attention_forward(p, c.q.dev, c.k.dev, c.v.dev, out, lse);
  const Tensor out_rows = heads_to_rows(out, p.S, p.B, p.Hq, p.D);
  const Tensor dout = rows_to_heads(c.dout_rows.dev, p.S, p.B, p.Hq, p.D);
  attention_backward(p, c.q.dev, c.k.dev, c.v.dev, out, lse, dout, dq, dk, dv);
  return {host(out_rows), host(lse), host(dq), host(dk), host(dv)};
}

void expect_bit_equal(const char* what, const ops::AttentionShape& p, const Result& got, const Result& want) {
  EXPECT_TRUE(bit_equal(got.out_rows, want.out_rows)) << what << " out, " << str(p);
  EXPECT_TRUE(bit_equal(got.lse, want.lse)) << what << " lse, " << str(p);
  EXPECT_TRUE(bit_equal(got.dq, want.dq)) << what << " dq, " << str(p);
  EXPECT_TRUE(bit_equal(got.dk, want.dk)) << what << " dk, " << str(p);
  EXPECT_TRUE(bit_equal(got.dv, want.dv)) << what << " dv, " << str(p);
}

// The CPU reference (fp32 on the rounded inputs), with cuda_attention_cudnn_test.cpp's tolerances.
void expect_matches_cpu(const Case& c, const Result& got) {
  const ops::AttentionShape& p = c.p;
  const size_t nq = c.q.host.size(), nk = c.k.host.size();
  const std::vector<float> dout = rows_to_heads_host(c.dout_rows.host, p);
  std::vector<float> out(nq), lse(static_cast<size_t>(p.B * p.Hq * p.S)), dq(nq), dk(nk), dv(nk);
  cpu::attention_forward(p, c.q.host.data(), c.k.host.data(), c.v.host.data(), out.data(), lse.data());
  cpu::attention_backward(p, c.q.host.data(), c.k.host.data(), c.v.host.data(), out.data(), lse.data(), dout.data(),
                          dq.data(), dk.data(), dv.data());
  const double eo = rel_l2(rows_to_heads_host(got.out_rows, p), out), el = test::max_abs_diff(got.lse, lse);
  const double eq = rel_l2(got.dq, dq), ek = rel_l2(got.dk, dk), ev = rel_l2(got.dv, dv);
  std::printf("[rows-vs-cpu] %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", str(p).c_str(), eo, el, eq, ek, ev);
  for (double e : {eo, el, eq, ek, ev}) EXPECT_LT(e, 2e-2) << str(p);
}

// cuDNN present and both rows graphs built (else a failure carrying cuDNN's reason).
bool cudnn_rows_ready(const ops::AttentionShape& p, bool deterministic = true) {
  std::string why;
  if (!cuda::cudnn_attention_supported(p, &why)) {
    ADD_FAILURE() << "cuDNN cannot run " << str(p) << ": " << why;
    return false;
  }
  const std::string fwd = cuda::cudnn_attention_prepare(p, false, true, AttnLayout::Rows);
  const std::string bwd = cuda::cudnn_attention_prepare(p, true, deterministic, AttnLayout::Rows);
  EXPECT_EQ(fwd, "") << "rows forward graph for " << str(p);
  EXPECT_EQ(bwd, "") << "rows backward graph (deterministic=" << deterministic << ") for " << str(p);
  return fwd.empty() && bwd.empty();
}

class GpuAttentionRows : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
    test::gpu();
  }
  void TearDown() override {
    cuda::set_attention_backend(AttentionBackend::Auto);
    cuda::set_attention_deterministic(true);
  }
  static bool have_cudnn() { return cuda::cudnn_attention_compiled(); }
};

const ops::AttentionShape kShapes[] = {
    params(2, 8, 2, 256, 64, true),    // GQA, llama's head dim
    params(2, 4, 4, 256, 64, true),    // MHA
    params(1, 4, 4, 256, 128, false),  // MHA, D 128, no mask
};

TEST_F(GpuAttentionRows, CudnnRowsEqualHeadsPlusCopies) {
  if (!have_cudnn()) GTEST_SKIP() << "this build has no cuDNN";
  uint64_t seed = 100;
  for (const ops::AttentionShape& p : kShapes) {
    if (!cudnn_rows_ready(p)) continue;
    const Case c = make_case(p, seed += 10);
    bool direct = false;
    const Result rows = run_rows(c, &direct);  // first, on poisoned memory: every element written
    EXPECT_TRUE(direct) << "the rows entry points did not take cuDNN's strided path for " << str(p);
    const Result ref = run_heads_plus_copies(c);  // auto: cuDNN in the heads layout
    EXPECT_TRUE(bit_equal(rows.out_rows, ref.out_rows)) << "out, " << str(p);
    EXPECT_TRUE(bit_equal(rows.lse, ref.lse)) << "lse, " << str(p);
    // The same graph but for dO's and O's strides: expected bit-identical too; should cuDNN's
    // heuristics pick another engine for them, the sums may be ordered differently.
    const bool same = bit_equal(rows.dq, ref.dq) && bit_equal(rows.dk, ref.dk) && bit_equal(rows.dv, ref.dv);
    const double eq = rel_l2(rows.dq, ref.dq), ek = rel_l2(rows.dk, ref.dk), ev = rel_l2(rows.dv, ref.dv);
    std::printf("[rows-vs-heads] %s: backward bit-identical %d (dq %.2e dk %.2e dv %.2e)\n", str(p).c_str(),
                same ? 1 : 0, eq, ek, ev);
    for (double e : {eq, ek, ev}) EXPECT_LT(e, 4e-3) << str(p);
    expect_matches_cpu(c, rows);
  }
}

TEST_F(GpuAttentionRows, CudnnRowsBackwardDeterministic) {
  if (!have_cudnn()) GTEST_SKIP() << "this build has no cuDNN";
  for (const ops::AttentionShape& p : kShapes) {
    if (!cudnn_rows_ready(p)) continue;
    const Case c = make_case(p, 7);
    expect_bit_equal("rows run twice", p, run_rows(c), run_rows(c));
  }
}

// --attention-backend fused takes the strided path too; the nondeterministic backward
// (--nondeterministic-attention, its own graph and plan) is checked for accuracy only.
TEST_F(GpuAttentionRows, FusedAndNondeterministic) {
  if (!have_cudnn()) GTEST_SKIP() << "this build has no cuDNN";
  const ops::AttentionShape p = kShapes[0];
  if (!cudnn_rows_ready(p) || !cudnn_rows_ready(p, false)) return;
  const Case c = make_case(p, 11);
  const Result automatic = run_rows(c);
  cuda::set_attention_backend(AttentionBackend::Fused);
  bool direct = false;
  expect_bit_equal("fused vs auto", p, run_rows(c, &direct), automatic);
  EXPECT_TRUE(direct) << str(p);
  cuda::set_attention_backend(AttentionBackend::Auto);
  cuda::set_attention_deterministic(false);
  const Result nondet = run_rows(c, &direct);
  EXPECT_TRUE(direct) << str(p);
  EXPECT_TRUE(bit_equal(nondet.out_rows, automatic.out_rows)) << str(p);
  expect_matches_cpu(c, nondet);
}

// Where cuDNN is not chosen the rows functions are the composition: bit-identical to it.
TEST_F(GpuAttentionRows, FallbacksAreTheComposition) {
  struct Fallback {
    const char* what;
    AttentionBackend backend;
    ops::AttentionShape p;
    DType dt;
  };
  const Fallback cases[] = {
      {"flash backend", AttentionBackend::Flash, params(2, 8, 2, 256, 64, true), DType::BF16},
      {"dropout", AttentionBackend::Auto, params(2, 8, 2, 128, 64, true, 0.1f), DType::BF16},
      {"fp16", AttentionBackend::Auto, params(2, 4, 2, 64, 64, true), DType::F16},
      {"odd head dim", AttentionBackend::Auto, params(1, 4, 4, 64, 36, false), DType::BF16},
  };
  uint64_t seed = 500;
  for (const Fallback& f : cases) {
    cuda::set_attention_backend(f.backend);
    const Case c = make_case(f.p, seed += 10, f.dt);
    bool direct = true;
    const Result rows = run_rows(c, &direct);
    EXPECT_FALSE(direct) << f.what;
    expect_bit_equal(f.what, f.p, rows, run_heads_plus_copies(c));
  }
}

}  // namespace
}  // namespace mt::ops

#endif  // MT_HAVE_CUDA
