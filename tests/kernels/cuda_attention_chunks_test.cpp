// The GPU's chunk and packed-document attention (kernels/attention_shape.h; the generic CUDA
// kernels) against the CPU reference, and ring attention's building blocks run in sequence on
// one GPU (each query chunk against the key chunks at or before it, merged by attention_merge;
// backward per chunk pair from the merged out and lse) reproducing whole-sequence attention.
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <vector>

#include <type_traits>

#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/ops.h"
#include "support/gpu.h"
#include "test_util.h"

namespace mt {
namespace {

using test::random_vec;

ops::AttentionShape shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D) {
  return ops::AttentionShape{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
}

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

// CPU reference (fp32) or the CUDA kernels with storage T (float or bf16; inputs rounded alike).
template <typename T>
Result run(ops::AttentionShape p, const std::vector<int32_t>& cu, bool gpu, uint64_t seed) {
  const int64_t Sk = p.keys();
  auto in = [&](int64_t n, uint64_t sd, double lo) {
    std::vector<float> x = random_vec<float>(static_cast<size_t>(n), sd, lo, -lo);
    return std::is_same_v<T, float> ? x : test::rounded(x);
  };
  const auto q = in(p.B * p.Hq * p.S * p.D, seed, -2), k = in(p.B * p.Hkv * Sk * p.D, seed + 1, -2),
             v = in(p.B * p.Hkv * Sk * p.D, seed + 2, -1), g = in(p.B * p.Hq * p.S * p.D, seed + 3, -1);
  Result r{std::vector<float>(q.size()), std::vector<float>(static_cast<size_t>(p.B * p.Hq * p.S)),
           std::vector<float>(q.size()), std::vector<float>(k.size()), std::vector<float>(k.size())};
  if (!cu.empty()) p.num_segments = static_cast<int64_t>(cu.size()) - 1;
  if (!gpu) {
    if (!cu.empty()) p.cu_seqlens = cu.data();
    cpu::attention_forward(p, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
    cpu::attention_backward(p, q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), g.data(), r.dq.data(),
                            r.dk.data(), r.dv.data());
    return r;
  }
  cuda::DeviceBuffer<int32_t> dcu(cu);
  if (!cu.empty()) p.cu_seqlens = dcu.get();
  cuda::DeviceBuffer<T> dq_(q), dk_(k), dv_(v), dg(g), out(q.size()), gq(q.size()), gk(k.size()), gv(k.size());
  cuda::DeviceBuffer<float> lse(r.lse.size());
  // Poison (NaN) outputs: every element must be written, the keys no query sees included.
  out.fill_bytes(0xff), gq.fill_bytes(0xff), gk.fill_bytes(0xff), gv.fill_bytes(0xff), lse.fill_bytes(0xff);
  cuda::attention_forward(p, dq_.get(), dk_, dv_, out, lse, nullptr);
  cuda::attention_backward(p, dq_.get(), dk_, dv_, out, lse, dg, gq, gk, gv, nullptr);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  auto f = [](const auto& v) { return std::vector<float>(v.begin(), v.end()); };
  return {f(out.download()), lse.download(), f(gq.download()), f(gk.download()), f(gv.download())};
}

// A row that sees no key (a chunk before its document starts) has lse = +inf on both devices:
// those must agree exactly; the finite ones are compared as the other outputs.
void expect_close_lse(std::vector<float> gpu, std::vector<float> cpu, double tol) {
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    if (std::isinf(cpu[i]) || std::isinf(gpu[i])) {
      EXPECT_EQ(gpu[i], cpu[i]) << "lse row " << i;
      gpu[i] = cpu[i] = 0.f;
    }
  EXPECT_LT(test::rel_l2(gpu, cpu), tol);
}

void expect_close(const Result& gpu, const Result& cpu, double tol) {
  EXPECT_LT(test::rel_l2(gpu.out, cpu.out), tol);
  expect_close_lse(gpu.lse, cpu.lse, tol);
  EXPECT_LT(test::rel_l2(gpu.dq, cpu.dq), tol);
  EXPECT_LT(test::rel_l2(gpu.dk, cpu.dk), tol);
  EXPECT_LT(test::rel_l2(gpu.dv, cpu.dv), tol);
}

class AttentionChunksGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
    test::gpu();
  }
};

// Variable-length (packed-document) attention matches the CPU: fp32 tightly (the generic
// kernels), bf16 within the tensor-core kernels' bound (GpuAttention.TensorCoreMatchesCpu's:
// they round P and dS to bf16).
TEST_F(AttentionChunksGpu, PackedDocumentsMatchCpu) {
  const ops::AttentionShape p = shape(2, 4, 2, 200, 64);
  const std::vector<int32_t> cu{0, 70, 71, 200, 230, 330, 400};
  expect_close(run<float>(p, cu, true, 5), run<float>(p, cu, false, 5), 1e-5);
  expect_close(run<cuda::bf16>(p, cu, true, 5), run<cuda::bf16>(p, cu, false, 5), 2e-2);
}

// A query chunk against a key chunk at positions (partly causal), with and without documents.
TEST_F(AttentionChunksGpu, ChunkAtOffsetsMatchesCpu) {
  ops::AttentionShape p = shape(2, 4, 1, 48, 32);
  p.Sk = 64;
  p.q_pos = 96;
  p.k_pos = 64;
  p.seq_total = 192;
  for (const auto& cu : {std::vector<int32_t>{}, std::vector<int32_t>{0, 100, 130, 192, 250, 384}})
    expect_close(run<float>(p, cu, true, 9), run<float>(p, cu, false, 9), 1e-5);
}

// The ranged tensor-core kernels (bf16, head dims 64 and 128; attention_fwd.cu / attention_bwd.cu):
// documents of 1 token, documents crossing the 64-row tiles, a sequence that is no multiple of
// a tile, GQA, causal and not.
TEST_F(AttentionChunksGpu, PackedDocumentsTensorCoresMatchCpu) {
  for (const int64_t D : {64, 128})
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " causal=" << causal);
      ops::AttentionShape p = shape(2, 4, 2, 300, D);
      p.causal = causal;
      const std::vector<int32_t> cu{0, 1, 2, 63, 64, 65, 190, 300, 301, 430, 431, 600};
      expect_close(run<cuda::bf16>(p, cu, true, 11), run<cuda::bf16>(p, cu, false, 11), 2e-2);
    }
}

// A longer packed sample (many tiles, documents of every size) as training sees it.
TEST_F(AttentionChunksGpu, LongPackedSampleTensorCoresMatchCpu) {
  const ops::AttentionShape p = shape(1, 4, 1, 2048, 128);
  const std::vector<int32_t> cu{0, 5, 700, 701, 1024, 1100, 1999, 2048};
  expect_close(run<cuda::bf16>(p, cu, true, 13), run<cuda::bf16>(p, cu, false, 13), 2e-2);
}

// Chunk pairs at every relation ring attention meets: keys before the queries (all visible),
// on the diagonal, after them (nothing visible: out 0, lse +inf, zero gradients), with and
// without documents, through the tensor-core kernels.
TEST_F(AttentionChunksGpu, ChunkPairsTensorCoresMatchCpu) {
  struct Pair {
    int64_t q_pos, k_pos;
  };
  for (const int64_t D : {64, 128})
    for (const Pair pr : {Pair{200, 0}, Pair{100, 100}, Pair{100, 80}, Pair{0, 200}})
      for (const auto& cu : {std::vector<int32_t>{}, std::vector<int32_t>{0, 90, 150, 151, 300, 420, 600}}) {
        SCOPED_TRACE(testing::Message() << "D=" << D << " q_pos=" << pr.q_pos << " k_pos=" << pr.k_pos
                                        << " docs=" << !cu.empty());
        ops::AttentionShape p = shape(2, 4, 2, 100, D);
        p.Sk = 100;
        p.q_pos = pr.q_pos;
        p.k_pos = pr.k_pos;
        p.seq_total = 300;
        expect_close(run<cuda::bf16>(p, cu, true, 17), run<cuda::bf16>(p, cu, false, 17), 2e-2);
      }
}

Tensor seq_rows(const Tensor& x, int64_t s0, int64_t n) {
  const int64_t BH = x.dim(0) * x.dim(1), S = x.dim(2), D = x.dim(3);
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), n, D}, x.dtype(), x.device());
  for (int64_t h = 0; h < BH; ++h) y.flat_range(h * n * D, {n * D}).copy_from(x.flat_range((h * S + s0) * D, {n * D}));
  return y;
}
void add_rows(Tensor& y, const Tensor& x, int64_t s0) {
  const int64_t BH = y.dim(0) * y.dim(1), S = y.dim(2), n = x.dim(2), D = y.dim(3);
  for (int64_t h = 0; h < BH; ++h) {
    Tensor dst = y.flat_range((h * S + s0) * D, {n * D});
    ops::add_inplace(dst, x.flat_range(h * n * D, {n * D}));
  }
}

// Ring attention's blocks in sequence on one GPU equal whole-sequence attention on it (fp16
// tensors: the Tensor ops run them through the fp32 generic kernels, merges included).
TEST_F(AttentionChunksGpu, ChunksInSequenceReproduceFullAttention) {
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 256, D = 64, C = 8, L = S / C;
  const ops::AttentionShape full = shape(B, Hq, Hkv, S, D);
  auto dev = [](std::vector<float> v, Shape s) { return Tensor::from_vector(v, s).to(DType::F16).to_device(Device::CUDA); };
  auto zeros = [](const Shape& s) { return Tensor::zeros(s, DType::F16, Device::CUDA); };
  auto host = [](const Tensor& t) { return t.to_device(Device::CPU).to_vector(); };
  const Tensor q = dev(random_vec<float>(B * Hq * S * D, 31, -2, 2), {B, Hq, S, D});
  const Tensor k = dev(random_vec<float>(B * Hkv * S * D, 32, -2, 2), {B, Hkv, S, D});
  const Tensor v = dev(random_vec<float>(B * Hkv * S * D, 33), {B, Hkv, S, D});
  const Tensor g = dev(random_vec<float>(B * Hq * S * D, 34), {B, Hq, S, D});
  Tensor out, lse, dq, dk, dv;
  ops::attention_forward(full, q, k, v, out, lse);
  ops::attention_backward(full, q, k, v, out, lse, g, dq, dk, dv);
  Tensor cdq = zeros(q.shape()), cdk = zeros(k.shape()), cdv = zeros(v.shape()), cout = zeros(q.shape());
  for (int64_t qc = 0; qc < C; ++qc) {
    auto pair = [&](int64_t kc) {
      ops::AttentionShape p = full;
      p.S = p.Sk = L;
      p.q_pos = qc * L;
      p.k_pos = kc * L;
      p.seq_total = S;
      return p;
    };
    const Tensor qi = seq_rows(q, qc * L, L), gi = seq_rows(g, qc * L, L);
    Tensor o, l;
    for (int64_t kc = 0; kc <= qc; ++kc) {
      Tensor po, pl;
      ops::attention_forward(pair(kc), qi, seq_rows(k, kc * L, L), seq_rows(v, kc * L, L), po, pl);
      if (kc == 0) {
        o = po;
        l = pl;
      } else {
        ops::attention_merge(o, l, po, pl);
      }
    }
    add_rows(cout, o, qc * L);
    for (int64_t kc = 0; kc <= qc; ++kc) {
      Tensor gq, gk, gv;
      ops::attention_backward(pair(kc), qi, seq_rows(k, kc * L, L), seq_rows(v, kc * L, L), o, l, gi, gq, gk, gv);
      add_rows(cdq, gq, qc * L);
      add_rows(cdk, gk, kc * L);
      add_rows(cdv, gv, kc * L);
    }
  }
  EXPECT_LT(test::rel_l2(host(cout), host(out)), 3e-3);
  EXPECT_LT(test::rel_l2(host(cdq), host(dq)), 3e-3);
  EXPECT_LT(test::rel_l2(host(cdk), host(dk)), 3e-3);
  EXPECT_LT(test::rel_l2(host(cdv), host(dv)), 3e-3);
}

}  // namespace
}  // namespace mt

#endif  // MT_HAVE_CUDA
