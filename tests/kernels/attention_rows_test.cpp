// The attention core with its output in linear_proj's row layout (ops::attention_forward_rows) on
// the CPU, where it is the composition attention + heads_to_rows (rows_to_heads + attention
// backward): bit-identical to it, element (b,h,s,d) at ((s*B + b)*Hq + h)*D + d.

#include <cmath>

#include "core/error.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt::ops {
namespace {

using test::bit_equal;
using test::random_vec;

ops::AttentionShape params(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal, float drop) {
  ops::AttentionShape p{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = causal;
  p.dropout_p = drop;
  p.seed = 77;
  p.offset = 5;
  return p;
}

Tensor random_tensor(const Shape& s, uint64_t seed) {
  return Tensor::from_vector(random_vec<float>(static_cast<size_t>(shape_numel(s)), seed, -2, 2), s);
}

void check_case(const ops::AttentionShape& p) {
  const int64_t rows = p.S * p.B, cols = p.Hq * p.D;
  const Tensor q = random_tensor({p.B, p.Hq, p.S, p.D}, 1), k = random_tensor({p.B, p.Hkv, p.S, p.D}, 2),
               v = random_tensor({p.B, p.Hkv, p.S, p.D}, 3), dout_rows = random_tensor({rows, cols}, 4);

  Tensor out, lse, out_rows, lse_rows;
  attention_forward(p, q, k, v, out, lse);
  attention_forward_rows(p, q, k, v, out_rows, lse_rows);
  ASSERT_EQ(out_rows.shape(), (Shape{rows, cols}));
  EXPECT_TRUE(bit_equal(out_rows.to_vector(), heads_to_rows(out, p.S, p.B, p.Hq, p.D).to_vector()));
  EXPECT_TRUE(bit_equal(lse_rows.to_vector(), lse.to_vector()));
  // The layout itself, independently of heads_to_rows: sequence-first rows.
  const float* o = out.data<float>();
  const float* r = out_rows.data<float>();
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t s = 0; s < p.S; ++s)
        for (int64_t d = 0; d < p.D; ++d)
          ASSERT_EQ(r[((s * p.B + b) * p.Hq + h) * p.D + d], o[((b * p.Hq + h) * p.S + s) * p.D + d]);

  Tensor dq, dk, dv, dq_r, dk_r, dv_r;
  attention_backward(p, q, k, v, out, lse, rows_to_heads(dout_rows, p.S, p.B, p.Hq, p.D), dq, dk, dv);
  attention_backward_rows(p, q, k, v, out_rows, lse_rows, dout_rows, dq_r, dk_r, dv_r);
  EXPECT_TRUE(bit_equal(dq_r.to_vector(), dq.to_vector()));
  EXPECT_TRUE(bit_equal(dk_r.to_vector(), dk.to_vector()));
  EXPECT_TRUE(bit_equal(dv_r.to_vector(), dv.to_vector()));
  EXPECT_EQ(dq_r.shape(), q.shape());
  EXPECT_EQ(dk_r.shape(), k.shape());
}

TEST(AttentionRows, CpuEqualsHeadsPlusCopyGqa) { check_case(params(2, 8, 2, 40, 16, true, 0.f)); }

TEST(AttentionRows, CpuEqualsHeadsPlusCopyMhaNonCausal) { check_case(params(3, 4, 4, 24, 8, false, 0.f)); }

TEST(AttentionRows, CpuEqualsHeadsPlusCopyWithDropout) { check_case(params(2, 4, 2, 32, 8, true, 0.2f)); }

TEST(AttentionRows, RejectsWrongRowShapes) {
  const ops::AttentionShape p = params(1, 2, 1, 8, 4, true, 0.f);
  const Tensor q = random_tensor({1, 2, 8, 4}, 1), k = random_tensor({1, 1, 8, 4}, 2),
               v = random_tensor({1, 1, 8, 4}, 3);
  Tensor out_rows, lse, dq, dk, dv;
  attention_forward_rows(p, q, k, v, out_rows, lse);
  const Tensor bad = random_tensor({8, 4}, 4);
  EXPECT_THROW(attention_backward_rows(p, q, k, v, out_rows, lse, bad, dq, dk, dv), Error);
}

}  // namespace
}  // namespace mt::ops
