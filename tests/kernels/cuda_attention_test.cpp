// CUDA flash attention against the CPU reference (kernels/cpu/attention.cpp): tensor-core
// kernels in bf16 (inputs rounded to bf16 for the reference, so only the arithmetic differs),
// the generic kernels in fp32 (tight tolerance), dropout through the shared Philox stream,
// determinism, and the device Philox generator against the host one.
#ifdef MT_HAVE_CUDA

#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "core/philox.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ops_cuda.h"
#include "test_util.h"

namespace mt::cuda {
namespace {

using test::random_vec;
using test::rounded;
using test::rel_l2;
using test::max_abs_diff;

ops::AttentionShape params(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal, float drop = 0.f) {
  ops::AttentionShape p{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = causal;
  p.dropout_p = drop;
  p.seed = 0x1234567890abcdefull;
  p.offset = 977;
  return p;
}

struct Inputs {
  std::vector<float> q, k, v, dout;
};
Inputs make_inputs(const ops::AttentionShape& p, uint64_t seed, bool round) {
  const size_t nq = p.B * p.Hq * p.S * p.D, nk = p.B * p.Hkv * p.S * p.D;
  Inputs in{random_vec<float>(nq, seed, -2, 2), random_vec<float>(nk, seed + 1, -2, 2),
            random_vec<float>(nk, seed + 2, -1, 1), random_vec<float>(nq, seed + 3, -1, 1)};
  if (round) {
    in.q = rounded(in.q), in.k = rounded(in.k), in.v = rounded(in.v), in.dout = rounded(in.dout);
  }
  return in;
}

struct Ref {
  std::vector<float> out, lse, dq, dk, dv;
};
Ref cpu_reference(const ops::AttentionShape& p, const Inputs& in) {
  Ref r{std::vector<float>(in.q.size()), std::vector<float>(p.B * p.Hq * p.S), std::vector<float>(in.q.size()),
        std::vector<float>(in.k.size()), std::vector<float>(in.k.size())};
  cpu::attention_forward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data());
  cpu::attention_backward(p, in.q.data(), in.k.data(), in.v.data(), r.out.data(), r.lse.data(), in.dout.data(),
                          r.dq.data(), r.dk.data(), r.dv.data());
  return r;
}

template <typename T>
Ref gpu_run(const ops::AttentionShape& p, const Inputs& in, bool generic = false) {
  DeviceBuffer<T> q(in.q), k(in.k), v(in.v), dout(in.dout);
  DeviceBuffer<T> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
  DeviceBuffer<float> lse(p.B * p.Hq * p.S);
  // Poison outputs: every element must be written.
  out.fill_bytes(0xff), dq.fill_bytes(0xff), dk.fill_bytes(0xff), dv.fill_bytes(0xff), lse.fill_bytes(0xff);
  if constexpr (std::is_same_v<T, bf16>) {
    if (generic) {
      attention_forward_generic(p, q.get(), k, v, out, lse, nullptr);
      attention_backward_generic(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr);
    } else {
      attention_forward(p, q.get(), k, v, out, lse, nullptr);
      attention_backward(p, q.get(), k, v, out, lse, dout, dq, dk, dv, nullptr);
    }
  } else {
    attention_forward(p, q.get(), k.get(), v.get(), out.get(), lse.get(), nullptr);
    attention_backward(p, q.get(), k.get(), v.get(), out.get(), lse.get(), dout.get(), dq.get(), dk.get(), dv.get(),
                       nullptr);
  }
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  return {out.download(), lse.download(), dq.download(), dk.download(), dv.download()};
}

void expect_close(const char* what, const ops::AttentionShape& p, const Ref& got, const Ref& want, double tol,
                  double lse_tol) {
  const double eo = rel_l2(got.out, want.out), eq = rel_l2(got.dq, want.dq), ek = rel_l2(got.dk, want.dk),
               ev = rel_l2(got.dv, want.dv), el = max_abs_diff(got.lse, want.lse);
  std::printf(
      "[%s] B=%lld Hq=%lld Hkv=%lld S=%lld D=%lld causal=%d drop=%.2f: out %.2e lse %.2e dq %.2e dk %.2e "
      "dv %.2e\n",
      what, static_cast<long long>(p.B), static_cast<long long>(p.Hq), static_cast<long long>(p.Hkv),
      static_cast<long long>(p.S), static_cast<long long>(p.D), p.causal, p.dropout_p, eo, el, eq, ek, ev);
  EXPECT_LT(eo, tol) << what << " out";
  EXPECT_LT(el, lse_tol) << what << " lse";
  EXPECT_LT(eq, tol) << what << " dq";
  EXPECT_LT(ek, tol) << what << " dk";
  EXPECT_LT(ev, tol) << what << " dv";
}

TEST(GpuPhilox, DeviceMatchesHost) {
  const uint64_t seed = 0xdeadbeefcafef00dull, offset = (uint64_t{7} << 33) + 5;
  for (uint64_t first : {uint64_t{0}, uint64_t{12345}, (uint64_t{1} << 40) + 3}) {
    const int64_t n = 10007;
    DeviceBuffer<float> d(n);
    philox_uniform(d, n, seed, offset, first, nullptr);
    const auto got = d.download();
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = Philox::uniform(seed, offset, first + static_cast<uint64_t>(i));
    EXPECT_TRUE(test::bit_equal(got, want)) << "first=" << first;
  }
}

TEST(GpuAttention, TensorCoreMatchesCpu) {
  const ops::AttentionShape cases[] = {
      params(2, 4, 2, 128, 64, true),   params(1, 8, 2, 256, 128, true),  params(1, 4, 1, 512, 64, true),
      params(1, 2, 2, 1024, 128, true), params(1, 4, 4, 1024, 64, true),  params(1, 4, 2, 200, 64, true),
      params(2, 2, 1, 192, 64, false),  params(1, 2, 1, 136, 128, false),
  };
  uint64_t seed = 100;
  for (const ops::AttentionShape& p : cases) {
    ASSERT_TRUE(attention_uses_tensor_cores(p));
    const Inputs in = make_inputs(p, seed += 10, true);
    expect_close("tc", p, gpu_run<bf16>(p, in), cpu_reference(p, in), 2e-2, 2e-2);
  }
}

TEST(GpuAttention, TensorCoreDropoutMatchesCpu) {
  for (const ops::AttentionShape& p : {params(1, 4, 2, 256, 64, true, 0.1f), params(1, 2, 1, 160, 128, true, 0.2f)}) {
    const Inputs in = make_inputs(p, 555, true);
    expect_close("tc-dropout", p, gpu_run<bf16>(p, in), cpu_reference(p, in), 2e-2, 2e-2);
  }
}

TEST(GpuAttention, GenericFp32MatchesCpu) {
  const ops::AttentionShape cases[] = {params(2, 4, 2, 64, 16, true),  params(1, 3, 1, 100, 32, true),
                                       params(1, 2, 2, 77, 48, false), params(1, 4, 2, 130, 80, true),
                                       params(1, 2, 1, 96, 64, true),  params(1, 2, 1, 64, 24, true, 0.25f)};
  uint64_t seed = 7;
  for (const ops::AttentionShape& p : cases) {
    const Inputs in = make_inputs(p, seed += 10, false);
    expect_close("generic-fp32", p, gpu_run<float>(p, in), cpu_reference(p, in), 1e-4, 1e-4);
  }
}

TEST(GpuAttention, GenericBf16MatchesCpu) {
  for (const ops::AttentionShape& p : {params(1, 4, 2, 128, 64, true), params(1, 2, 1, 90, 32, true)}) {
    const Inputs in = make_inputs(p, 31, true);
    expect_close("generic-bf16", p, gpu_run<bf16>(p, in, true), cpu_reference(p, in), 2e-2, 2e-2);
  }
}

TEST(GpuAttention, Deterministic) {
  for (const ops::AttentionShape& p : {params(2, 8, 2, 512, 64, true), params(1, 4, 1, 384, 128, true, 0.1f)}) {
    const Inputs in = make_inputs(p, 99, true);
    const Ref a = gpu_run<bf16>(p, in), b = gpu_run<bf16>(p, in);
    EXPECT_TRUE(test::bit_equal(a.out, b.out));
    EXPECT_TRUE(test::bit_equal(a.lse, b.lse));
    EXPECT_TRUE(test::bit_equal(a.dq, b.dq));
    EXPECT_TRUE(test::bit_equal(a.dk, b.dk));
    EXPECT_TRUE(test::bit_equal(a.dv, b.dv));
  }
}

}  // namespace
}  // namespace mt::cuda

#endif  // MT_HAVE_CUDA
