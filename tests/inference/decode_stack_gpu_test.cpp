// ops::decode_layer_stack on the GPU (issue #22): the whole-stack decode kernel
// (kernels/cuda/decode_stack.cu) against the ops it fuses run one by one on the decode kernels
// (fused_qkv_forward, cached_attention, linear_forward_residual, fused_linear_forward; the op's
// own composition, with the decode fusions' scope off so that the kernel stays out): the same
// output and the same KV cache contents, bit for bit; and within 3% of the largest output of the
// CPU's fp32 composition. Shapes cover both GEMV shapes of a column (fc2 rows of one round, and
// longer ones split over 4 warps), head dims 64 and 128, 1-4 query heads per group, biases on
// QKV and fc1, no RoPE, positions at the cache's start, middle and end (1 to several key splits),
// and more layers than one launch holds. Labelled gpu; forward-only (inference): no gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "kernels/device.h"
#include "kernels/ops.h"

namespace mt::test {
namespace {


struct StackCase {
  int64_t hidden, Hq, G, D, F, layers, L;
  bool biases, rope;
  DType dt;
};

// bf16-exact values in [-s, s] (+ `offset`), as CPU f32.
Tensor values(const Shape& shape, uint32_t seed, float s, float offset = 0.f) {
  Tensor t = random_bf16_values(shape, seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = t.data<float>()[i] * s + offset;
  return t.to(DType::BF16).to(DType::F32);
}

// One stack's tensors on one device (dtype dt there).
struct Stack {
  std::vector<Tensor> t;  // per layer: in_norm, qkv_w, qkv_b, proj_w, mlp_norm, fc1_w, fc1_b, fc2_w, k, v
  Tensor slot, pos, cos, sin;
  ops::DecodeStackRef ref(const StackCase& c) {
    ops::DecodeStackRef s;
    s.G = c.G;
    s.qpg = c.Hq / c.G;
    s.D = c.D;
    s.slot = &slot;
    s.pos = &pos;
    s.scale = 1.f / std::sqrt(static_cast<float>(c.D));
    if (c.rope) s.rope = {&cos, &sin, c.D};
    for (int64_t l = 0; l < c.layers; ++l) {
      Tensor* p = &t[static_cast<size_t>(l * 10)];
      ops::DecodeLayerRef r;
      r.input_norm = &p[0];
      r.input_eps = 1e-5f;
      r.qkv_w = &p[1];
      r.qkv_b = c.biases ? &p[2] : nullptr;
      r.proj_w = &p[3];
      r.mlp_norm = &p[4];
      r.mlp_eps = 1e-6f;
      r.fc1_w = &p[5];
      r.fc1_b = c.biases ? &p[6] : nullptr;
      r.fc2_w = &p[7];
      r.k_cache = &p[8];
      r.v_cache = &p[9];
      s.layers.push_back(r);
    }
    return s;
  }
};

Stack make_cpu_stack(const StackCase& c, int32_t position) {
  Stack s;
  const int64_t qkv = c.G * (c.Hq / c.G + 2) * c.D;
  uint32_t seed = 100;
  const float wq = 1.f / std::sqrt(static_cast<float>(c.hidden)), wf = 1.f / std::sqrt(static_cast<float>(c.F));
  for (int64_t l = 0; l < c.layers; ++l) {
    s.t.push_back(values({c.hidden}, ++seed, 0.2f, 1.f));
    s.t.push_back(values({qkv, c.hidden}, ++seed, wq));
    s.t.push_back(values({qkv}, ++seed, 0.1f));
    s.t.push_back(values({c.hidden, c.Hq * c.D}, ++seed, wq));
    s.t.push_back(values({c.hidden}, ++seed, 0.2f, 1.f));
    s.t.push_back(values({2 * c.F, c.hidden}, ++seed, wq));
    s.t.push_back(values({2 * c.F}, ++seed, 0.1f));
    s.t.push_back(values({c.hidden, c.F}, ++seed, wf));
    s.t.push_back(values({2, c.G, c.L, c.D}, ++seed, 1.f));  // slot 1's older positions are "the prompt"
    s.t.push_back(values({2, c.G, c.L, c.D}, ++seed, 1.f));
  }
  s.slot = Tensor::empty({1}, DType::I32);
  s.pos = Tensor::empty({1}, DType::I32);
  s.slot.data<int32_t>()[0] = 1;
  s.pos.data<int32_t>()[0] = position;
  s.cos = Tensor::empty({1, c.D / 2});
  s.sin = Tensor::empty({1, c.D / 2});
  for (int64_t i = 0; i < c.D / 2; ++i) {
    const double a = position * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(c.D));
    s.cos.data<float>()[i] = static_cast<float>(std::cos(a));
    s.sin.data<float>()[i] = static_cast<float>(std::sin(a));
  }
  return s;
}

Stack to_gpu(const Stack& h, DType dt) {
  Stack g;
  for (const Tensor& t : h.t) g.t.push_back(t.to(dt).to_device(Device::CUDA));
  g.slot = h.slot.to_device(Device::CUDA);
  g.pos = h.pos.to_device(Device::CUDA);
  g.cos = h.cos.to_device(Device::CUDA);
  g.sin = h.sin.to_device(Device::CUDA);
  return g;
}

// The layers one by one, as inference::ModelRunner runs them without the stack: the op itself
// with the decode fusions off, which leaves it to its composition (fused_qkv_forward,
// cached_attention with the merge kernel, which gives the fused merge's bits, the GEMVs).
Tensor layer_by_layer(const Tensor& x, const ops::DecodeStackRef& s) {
  const ops::DecodeKernels unfused(true, false);
  const int64_t before = stack_launches();
  Tensor y = ops::decode_layer_stack(x, s);
  EXPECT_EQ(stack_launches(), before) << "the reference ran the whole-stack kernel";
  return y;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to_device(Device::CPU), hb = b.to_device(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

TEST(DecodeStackGpu, OneKernelEqualsTheLayersOneByOne) {
  MT_REQUIRE_GPU();
  const std::vector<StackCase> cases = {
      {256, 4, 1, 64, 512, 3, 40, false, true, DType::BF16},      // one round per fc2 row, qpg 4
      {512, 8, 2, 64, 2304, 2, 300, false, true, DType::BF16},    // fc2 rows over 4 warps, several splits
      {1024, 8, 4, 128, 1024, 2, 70, true, false, DType::BF16},   // head dim 128, biases, no RoPE
      {256, 4, 2, 64, 512, 2, 200, false, true, DType::F16},      // fp16
      {128, 2, 1, 64, 128, 34, 16, false, true, DType::BF16},     // more layers than one launch holds
  };
  for (const StackCase& c : cases) {
    for (const int32_t position : {0, static_cast<int32_t>(c.L / 2), static_cast<int32_t>(c.L - 1)}) {
      const std::string what = "hidden " + std::to_string(c.hidden) + " Hq " + std::to_string(c.Hq) + " G " +
                               std::to_string(c.G) + " D " + std::to_string(c.D) + " F " + std::to_string(c.F) +
                               " layers " + std::to_string(c.layers) + " position " + std::to_string(position) + " " +
                               dtype_name(c.dt);
      Stack cpu = make_cpu_stack(c, position);
      const Tensor x = values({1, c.hidden}, 7, 1.f);
      const Tensor want = ops::decode_layer_stack(x, cpu.ref(c));  // the fp32 composition
      Stack one = to_gpu(make_cpu_stack(c, position), c.dt), each = to_gpu(make_cpu_stack(c, position), c.dt);
      const Tensor gx = x.to(c.dt).to_device(Device::CUDA);
      const ops::InferenceGemv gemv(true, ops::InferenceGemv::Kernel::Wide);
      const ops::DecodeKernels kernels(true, true);
      const int64_t before = stack_launches();
      const Tensor got = ops::decode_layer_stack(gx, one.ref(c));
      EXPECT_EQ(stack_launches() - before, (c.layers + 31) / 32) << what;
      const Tensor ref = layer_by_layer(gx, each.ref(c));
      EXPECT_TRUE(same_bytes(got, ref)) << what << ": output";
      for (size_t i = 0; i < one.t.size(); i += 10) {
        EXPECT_TRUE(same_bytes(one.t[i + 8], each.t[i + 8])) << what << ": k cache of layer " << i / 10;
        EXPECT_TRUE(same_bytes(one.t[i + 9], each.t[i + 9])) << what << ": v cache of layer " << i / 10;
      }
      const Tensor got32 = got.to_device(Device::CPU).to(DType::F32);
      double m = 0;
      for (int64_t i = 0; i < want.numel(); ++i) m = std::max(m, static_cast<double>(std::fabs(want.data<float>()[i])));
      EXPECT_LT(max_abs_diff(got32, want), 3e-2 * m) << what << ": against the CPU (largest |output| " << m << ")";
    }
  }
}

// Outside the decode kernels' scope (or for a shape the kernel does not take), the op is the ops
// one by one: no launch, the same bytes.
TEST(DecodeStackGpu, OtherwiseTheLayersRunOneByOne) {
  MT_REQUIRE_GPU();
  const StackCase wide{256, 8, 1, 64, 512, 2, 40, false, true, DType::BF16};  // 8 query heads per group
  const StackCase small{256, 4, 1, 64, 512, 2, 40, false, true, DType::BF16};
  for (const bool in_scope : {true, false}) {
    const StackCase& c = in_scope ? wide : small;
    Stack one = to_gpu(make_cpu_stack(c, 9), c.dt), each = to_gpu(make_cpu_stack(c, 9), c.dt);
    const Tensor gx = values({1, c.hidden}, 7, 1.f).to(c.dt).to_device(Device::CUDA);
    const ops::InferenceGemv gemv(true, ops::InferenceGemv::Kernel::Wide);
    const ops::DecodeKernels kernels(in_scope, true);
    const int64_t before = stack_launches();
    const Tensor got = ops::decode_layer_stack(gx, one.ref(c));
    EXPECT_EQ(stack_launches(), before) << in_scope;
    EXPECT_TRUE(same_bytes(got, layer_by_layer(gx, each.ref(c)))) << in_scope;
  }
}

}  // namespace
}  // namespace mt::test
