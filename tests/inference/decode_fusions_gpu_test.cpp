// The decode fusions on the GPU (ops.def: fused_linear_forward, qkv_split_to_cache; issue #22),
// both GEMV kernels (InferenceGemv::Kernel Wide and Base), bf16 and fp16. Labelled gpu.
//   fused_linear_forward on the GEMV: bit for bit the unfused GPU ops on the same GEMV kernel
//   (rmsnorm_forward, linear_forward, swiglu_forward: the fused kernel recomputes what they store,
//   in their order), and within 2% of the largest output of the CPU reference (bf16 outputs of
//   sums of up to 8,192 products; the composition's roundings). Shapes: llama-1.5b's QKV and a
//   slice of its fc1 (norm + SwiGLU), rows of 8,192 (the Wide kernel's 4 warps per column),
//   column counts that leave warps idle, and shapes the fusion leaves to the composition.
//   qkv_split_to_cache: bit for bit qkv_split + kv_cache_write (the same RoPE arithmetic).
//   fused_qkv_forward (norm, QKV product, RoPE, split into the cache in the GEMV): bit for bit
//   fused_linear_forward + qkv_split_to_cache.
// Forward-only inference ops: no gradient checks.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "gpu_support.h"
#include "kernels/device.h"
#include "kernels/ops.h"

namespace mt::test {
namespace {

using Kernel = ops::InferenceGemv::Kernel;

std::string kernel_name(Kernel k) { return k == Kernel::Wide ? " wide" : " base"; }

Tensor to_gpu(const Tensor& t, DType dt) { return t.to(dt).to_device(Device::CUDA); }
Tensor from_gpu(const Tensor& t) { return t.to_device(Device::CPU).to(DType::F32); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(t.data<float>()[i])));
  return m;
}

struct LinearCase {
  int64_t M, N, K;  // N: w's rows (2F with SwiGLU)
  bool norm, swiglu, bias, residual;
};

TEST(DecodeFusionsGpu, FusedLinearEqualsTheUnfusedOpsOnTheGemv) {
  MT_REQUIRE_GPU();
  const float eps = 1e-5f;
  for (const LinearCase& c : {LinearCase{1, 3072, 2048, true, false, false, false},  // llama-1.5b's QKV
                              LinearCase{2, 3072, 2048, true, false, false, false},
                              LinearCase{1, 2048, 2048, true, true, false, false},  // fc1, F = 1024
                              LinearCase{2, 512, 8192, true, true, false, false},   // K > 4,096 with the norm: the composition (gemv.cu)
                              LinearCase{1, 2048, 8192, false, true, false, false},
                              LinearCase{1, 512, 8192, false, false, false, true},  // fc2-like, residual
                              LinearCase{2, 42, 64, true, true, true, false},       // idle warps, bias
                              LinearCase{1, 37, 4096, true, false, true, true},
                              LinearCase{1, 30, 100, true, false, false, false},    // K % 8: the composition
                              LinearCase{3, 64, 64, true, true, false, false}}) {   // 3 rows: the composition
    const Tensor x = random_bf16_values({c.M, c.K}, 1 + static_cast<uint32_t>(c.K));
    const Tensor gamma = random_bf16_values({c.K}, 2), w = random_bf16_values({c.N, c.K}, 3);
    const Tensor b = random_bf16_values({c.N}, 4), res = random_bf16_values({c.M, c.N}, 5);
    const ops::LinearFusion cpu_f{c.norm ? &gamma : nullptr, eps, c.swiglu, c.residual ? &res : nullptr};
    const Tensor want = ops::fused_linear_forward(x, w, c.bias ? &b : nullptr, cpu_f);
    for (const DType dt : {DType::BF16, DType::F16}) {
      const Tensor gx = to_gpu(x, dt), gg = to_gpu(gamma, dt), gw = to_gpu(w, dt), gb = to_gpu(b, dt),
                   gr = to_gpu(res, dt);
      const Tensor* bias = c.bias ? &gb : nullptr;
      for (const Kernel k : {Kernel::Wide, Kernel::Base}) {
        const std::string what = "M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " +
                                 std::to_string(c.K) + " norm " + std::to_string(c.norm) + " swiglu " +
                                 std::to_string(c.swiglu) + " " + dtype_name(dt) +
                                 kernel_name(k);
        const ops::InferenceGemv gemv(true, k);
        const Tensor got = from_gpu(
            ops::fused_linear_forward(gx, gw, bias, {c.norm ? &gg : nullptr, eps, c.swiglu, c.residual ? &gr : nullptr}));
        Tensor xn = gx;
        if (c.norm) {
          Tensor rstd;
          xn = ops::rmsnorm_forward(gx, gg, eps, rstd);
        }
        Tensor y = c.residual ? ops::linear_forward_residual(xn, gw, bias, gr) : ops::linear_forward(xn, gw, bias);
        if (c.swiglu) y = ops::swiglu_forward(y);
        const Tensor unfused = from_gpu(y);
        EXPECT_EQ(max_abs_diff(got, unfused), 0.0) << what;
        EXPECT_LT(max_abs_diff(got, want), 2e-2 * std::max(1.0, max_abs(want))) << what;
      }
    }
  }
}

struct SplitCase {
  int64_t G, qpg, D, rot, N;
};

TEST(DecodeFusionsGpu, QkvSplitToCacheEqualsTheSplitThenTheWrite) {
  MT_REQUIRE_GPU();
  // llama-1.5b's heads (D 64, all rotated), partial rotary (D 128, 64 rotated), no RoPE, and head
  // dims the 16-byte kernel leaves to the composition (D 8 with 4-element halves, D 12).
  for (const SplitCase& c : {SplitCase{8, 4, 64, 64, 1}, SplitCase{8, 4, 64, 64, 2}, SplitCase{2, 3, 128, 64, 3},
                             SplitCase{4, 1, 64, 0, 1}, SplitCase{2, 2, 8, 8, 2}, SplitCase{2, 2, 12, 0, 1}}) {
    const int64_t slots = 3, L = 40, per = c.G * (c.qpg + 2) * c.D;
    const Tensor packed = random_bf16_values({c.N, per}, 11);
    std::vector<int32_t> sl, ps;
    for (int64_t i = 0; i < c.N; ++i) {
      sl.push_back(static_cast<int32_t>((i * 2 + 1) % slots));
      ps.push_back(static_cast<int32_t>((i * 17 + 5) % L));
    }
    const Tensor slot = Tensor::from_vector(sl, {c.N}).to_device(Device::CUDA);
    const Tensor pos = Tensor::from_vector(ps, {c.N}).to_device(Device::CUDA);
    const Tensor cs = random_bf16_values({c.N, std::max<int64_t>(c.rot / 2, 1)}, 12);
    const Tensor sn = random_bf16_values({c.N, std::max<int64_t>(c.rot / 2, 1)}, 13);
    const Tensor gcs = cs.to_device(Device::CUDA), gsn = sn.to_device(Device::CUDA);
    const ops::RopeRef rope = c.rot ? ops::RopeRef{&gcs, &gsn, c.rot} : ops::RopeRef{};
    const Tensor kc0 = random_bf16_values({slots, c.G, L, c.D}, 14), vc0 = random_bf16_values({slots, c.G, L, c.D}, 15);
    for (const DType dt : {DType::BF16, DType::F16}) {
      const std::string what = "G " + std::to_string(c.G) + " qpg " + std::to_string(c.qpg) + " D " +
                               std::to_string(c.D) + " rot " + std::to_string(c.rot) + " N " + std::to_string(c.N) +
                               " " + dtype_name(dt);
      const Tensor gp = to_gpu(packed, dt);
      Tensor kc = to_gpu(kc0, dt), vc = to_gpu(vc0, dt);
      const Tensor q = ops::qkv_split_to_cache(gp, kc, vc, slot, pos, c.G, c.qpg, c.D, rope);
      Tensor wq, wk, wv, kc2 = to_gpu(kc0, dt), vc2 = to_gpu(vc0, dt);
      ops::qkv_split(gp, wq, wk, wv, c.N, 1, c.G, c.qpg, c.D, rope);
      ops::kv_cache_write(kc2, vc2, wk, wv, slot, pos);
      EXPECT_EQ(max_abs_diff(from_gpu(q), from_gpu(wq)), 0.0) << what;
      EXPECT_EQ(max_abs_diff(from_gpu(kc), from_gpu(kc2)), 0.0) << what;
      EXPECT_EQ(max_abs_diff(from_gpu(vc), from_gpu(vc2)), 0.0) << what;
    }
  }
}

// fused_qkv_forward in the GEMV against fused_linear_forward + qkv_split_to_cache on the same
// GEMV kernel: bit for bit (q and both caches). llama-1.5b's QKV (8 groups of 4 + 2 heads of 64),
// the tiny models' head dim 8, no RoPE, a bias, 2 rows, and a partial rotary (the composition).
struct QkvCase {
  int64_t M, G, qpg, D, rot, K;
  bool bias;
};

TEST(DecodeFusionsGpu, FusedQkvEqualsTheLinearThenTheSplitIntoTheCache) {
  MT_REQUIRE_GPU();
  for (const QkvCase& c : {QkvCase{1, 8, 4, 64, 64, 2048, false}, QkvCase{2, 8, 4, 64, 64, 2048, false},
                           QkvCase{1, 2, 2, 8, 8, 32, false}, QkvCase{2, 4, 1, 64, 0, 256, true},
                           QkvCase{1, 2, 3, 128, 64, 512, false}}) {
    const int64_t slots = 2, L = 24, out = c.G * (c.qpg + 2) * c.D;
    const Tensor x = random_bf16_values({c.M, c.K}, 31), gamma = random_bf16_values({c.K}, 32);
    const Tensor w = random_bf16_values({out, c.K}, 33), b = random_bf16_values({out}, 34);
    const Tensor slot = Tensor::from_vector(std::vector<int32_t>{1, 0}, {2}).slice(0, c.M).to_device(Device::CUDA);
    const Tensor pos = Tensor::from_vector(std::vector<int32_t>{17, 3}, {2}).slice(0, c.M).to_device(Device::CUDA);
    const int64_t half = std::max<int64_t>(c.rot / 2, 1);
    const Tensor cs = random_bf16_values({c.M, half}, 35).to_device(Device::CUDA);
    const Tensor sn = random_bf16_values({c.M, half}, 36).to_device(Device::CUDA);
    const ops::RopeRef rope = c.rot ? ops::RopeRef{&cs, &sn, c.rot} : ops::RopeRef{};
    const Tensor kc0 = random_bf16_values({slots, c.G, L, c.D}, 37), vc0 = random_bf16_values({slots, c.G, L, c.D}, 38);
    for (const DType dt : {DType::BF16, DType::F16}) {
      for (const Kernel k : {Kernel::Wide, Kernel::Base}) {
        const std::string what = "M " + std::to_string(c.M) + " G " + std::to_string(c.G) + " qpg " +
                                 std::to_string(c.qpg) + " D " + std::to_string(c.D) + " rot " + std::to_string(c.rot) +
                                 " " + dtype_name(dt) + kernel_name(k);
        const ops::InferenceGemv gemv(true, k);
        const Tensor gx = to_gpu(x, dt), gg = to_gpu(gamma, dt), gw = to_gpu(w, dt), gb = to_gpu(b, dt);
        const Tensor* bias = c.bias ? &gb : nullptr;
        Tensor kc = to_gpu(kc0, dt), vc = to_gpu(vc0, dt), kc2 = to_gpu(kc0, dt), vc2 = to_gpu(vc0, dt);
        const Tensor q = ops::fused_qkv_forward(gx, gw, bias, {&gg, 1e-5f}, kc, vc, slot, pos, c.G, c.qpg, c.D, rope);
        const Tensor packed = ops::fused_linear_forward(gx, gw, bias, {&gg, 1e-5f});
        const Tensor wq = ops::qkv_split_to_cache(packed, kc2, vc2, slot, pos, c.G, c.qpg, c.D, rope);
        EXPECT_EQ(max_abs_diff(from_gpu(q), from_gpu(wq)), 0.0) << what;
        EXPECT_EQ(max_abs_diff(from_gpu(kc), from_gpu(kc2)), 0.0) << what;
        EXPECT_EQ(max_abs_diff(from_gpu(vc), from_gpu(vc2)), 0.0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace mt::test
