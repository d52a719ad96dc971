// The residual add fused into the norms at the Tensor level (ops::add_*norm_forward, dx_add in
// the norm backwards), which the transformer layer uses for both residual adds' gradients and
// the attention residual: on the CPU the fused calls equal the unfused add + norm bit for bit;
// on the GPU (bf16) they match that CPU composition on the same rounded inputs.
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "test_util.h"
#ifdef MT_HAVE_CUDA
#include "support/gpu.h"
#endif

namespace mt::ops {
namespace {

using test::random_vec;
using test::rel_l2;

struct Inputs {
  Tensor x, res, w, b, dy, dadd;
};

// Inputs already representable in bf16, so the CPU fp32 composition and the GPU bf16 kernels
// see the same values.
Inputs make_inputs(int64_t rows, int64_t dim) {
  auto bf = [](const std::vector<float>& v, const Shape& s) {
    return Tensor::from_vector(v, s).to(DType::BF16).to(DType::F32);
  };
  return {bf(random_vec<float>(rows * dim, 1, -2, 2), {rows, dim}),
          bf(random_vec<float>(rows * dim, 2, -2, 2), {rows, dim}),
          bf(random_vec<float>(dim, 3, 0.5, 1.5), {dim}),
          bf(random_vec<float>(dim, 4, -0.5, 0.5), {dim}),
          bf(random_vec<float>(rows * dim, 5, -1, 1), {rows, dim}),
          bf(random_vec<float>(rows * dim, 6, -1, 1), {rows, dim})};
}

struct Results {
  std::vector<float> sum, y, dx, dw, db;
};

// The fused calls; `unfused` instead adds first and adds dx_add after, as the layer did before.
Results run(const Inputs& in, bool ln, bool unfused, Device dev) {
  auto on = [&](const Tensor& t) { return dev == Device::CPU ? t : t.to(DType::BF16).to_device(dev); };
  const Tensor x = on(in.x), res = on(in.res), w = on(in.w), b = on(in.b), dy = on(in.dy), dadd = on(in.dadd);
  const int64_t dim = in.w.numel();
  Tensor dw = Tensor::zeros({dim}, DType::F32, dev), db = Tensor::zeros({dim}, DType::F32, dev);
  Tensor sum, mean, rstd, y, dx;
  if (unfused) {
    sum = x.clone();
    add_inplace(sum, res);
    y = ln ? layernorm_forward(sum, w, b, 1e-5f, mean, rstd) : rmsnorm_forward(sum, w, 1e-5f, rstd);
    dx = ln ? layernorm_backward(dy, sum, w, mean, rstd, dw, db) : rmsnorm_backward(dy, sum, w, rstd, dw);
    add_inplace(dx, dadd);
  } else {
    y = ln ? add_layernorm_forward(x, res, w, b, 1e-5f, mean, rstd, sum)
           : add_rmsnorm_forward(x, res, w, 1e-5f, rstd, sum);
    dx = ln ? layernorm_backward(dy, sum, w, mean, rstd, dw, db, &dadd) : rmsnorm_backward(dy, sum, w, rstd, dw, &dadd);
  }
  auto host = [](const Tensor& t) { return t.to_device(Device::CPU).to_vector(); };
  return {host(sum), host(y), host(dx), host(dw), host(db)};
}

TEST(ResidualNorm, FusedEqualsAddThenNormOnTheCpu) {
  for (bool ln : {false, true}) {
    const Inputs in = make_inputs(37, 96);
    const Results a = run(in, ln, false, Device::CPU), b = run(in, ln, true, Device::CPU);
    EXPECT_EQ(a.sum, b.sum);
    EXPECT_EQ(a.y, b.y);
    EXPECT_EQ(a.dx, b.dx);
    EXPECT_EQ(a.dw, b.dw);
    EXPECT_EQ(a.db, b.db);
  }
}

#ifdef MT_HAVE_CUDA
TEST(GpuResidualNorm, FusedMatchesTheCpuComposition) {
  if (!test::have_gpu()) GTEST_SKIP() << "no GPU";
  test::gpu();
  // 1000 rows: many dw partial chunks (the fixed-order second stage over 16 chunk groups).
  for (bool ln : {false, true}) {
    const Inputs in = make_inputs(1000, 2048);
    const Results ref = run(in, ln, true, Device::CPU), g = run(in, ln, false, Device::CUDA);
    const Results g2 = run(in, ln, false, Device::CUDA);
    EXPECT_LT(rel_l2(g.sum, ref.sum), 3e-3) << "ln=" << ln;  // bf16 rounding of the stored sum
    EXPECT_LT(rel_l2(g.y, ref.y), 1e-2) << "ln=" << ln;
    EXPECT_LT(rel_l2(g.dx, ref.dx), 1e-2) << "ln=" << ln;
    EXPECT_LT(rel_l2(g.dw, ref.dw), 1e-2) << "ln=" << ln;
    if (ln) {
      EXPECT_LT(rel_l2(g.db, ref.db), 1e-2);
    }
    EXPECT_EQ(g.dx, g2.dx) << "deterministic";
    EXPECT_EQ(g.dw, g2.dw) << "deterministic";
  }
}
#endif

}  // namespace
}  // namespace mt::ops
