// The two generalisations of the attention core (kernels/attention_shape.h): packed documents
// (cu_seqlens) equal each document's attention run on its own, and context parallelism's
// building blocks (a query chunk against a key chunk at causal positions, and the log-sum-exp
// merge) reproduce whole-sequence attention when the chunks are run in sequence; finite
// differences check the backward of both forms, and thread counts do not change a bit.
#include <cmath>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

ops::AttentionShape shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D) {
  return ops::AttentionShape{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
}

// Document lengths per sample -> the batch's cu_seqlens.
std::vector<int32_t> cu_of(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int32_t> cu{0};
  for (const auto& sample : docs)
    for (int32_t len : sample) cu.push_back(cu.back() + len);
  return cu;
}

struct Run {
  std::vector<double> out, lse, dq, dk, dv;
};

Run run(const ops::AttentionShape& p, const std::vector<double>& q, const std::vector<double>& k,
        const std::vector<double>& v, const std::vector<double>& dout) {
  Run r{std::vector<double>(q.size()), std::vector<double>(static_cast<size_t>(p.B * p.Hq * p.S)),
        std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(v.size())};
  attention_forward(p, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
  attention_backward(p, q.data(), k.data(), v.data(), r.out.data(), r.lse.data(), dout.data(), r.dq.data(),
                     r.dk.data(), r.dv.data());
  return r;
}

// Rows [s0, s0 + n) of every head of a [B, H, S, D] tensor (as doubles).
std::vector<double> rows_of(const std::vector<double>& x, int64_t BH, int64_t S, int64_t D, int64_t s0, int64_t n) {
  std::vector<double> y(static_cast<size_t>(BH * n * D));
  for (int64_t h = 0; h < BH; ++h)
    std::copy_n(x.begin() + (h * S + s0) * D, n * D, y.begin() + h * n * D);
  return y;
}

// Packed documents: every document's rows equal a separate run over that document alone.
void check_packed(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D,
                  const std::vector<std::vector<int32_t>>& docs) {
  ops::AttentionShape p = shape(B, Hq, Hkv, S, D);
  const std::vector<int32_t> cu = cu_of(docs);
  p.cu_seqlens = cu.data();
  p.num_segments = static_cast<int64_t>(cu.size()) - 1;
  const auto q = random_vec(B * Hq * S * D, 1, -2, 2), k = random_vec(B * Hkv * S * D, 2, -2, 2),
             v = random_vec(B * Hkv * S * D, 3), g = random_vec(B * Hq * S * D, 4);
  const Run packed = run(p, q, k, v, g);
  for (int64_t b = 0; b < B; ++b) {
    int64_t s0 = 0;
    for (int32_t len : docs[static_cast<size_t>(b)]) {
      const ops::AttentionShape pd = shape(1, Hq, Hkv, len, D);
      auto sub = [&](const std::vector<double>& x, int64_t H) {
        return rows_of(std::vector<double>(x.begin() + b * H * S * D, x.begin() + (b + 1) * H * S * D), H, S, D, s0,
                       len);
      };
      const Run alone = run(pd, sub(q, Hq), sub(k, Hkv), sub(v, Hkv), sub(g, Hq));
      auto expect_rows = [&](const std::vector<double>& got, const std::vector<double>& want, int64_t H,
                             const char* what) {
        const std::vector<double> mine = sub(got, H);
        ASSERT_EQ(mine.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(mine[i], want[i], 1e-12 * (1 + std::fabs(want[i]))) << what << " sample " << b << " doc at " << s0;
      };
      expect_rows(packed.out, alone.out, Hq, "out");
      expect_rows(packed.dq, alone.dq, Hq, "dq");
      expect_rows(packed.dk, alone.dk, Hkv, "dk");
      expect_rows(packed.dv, alone.dv, Hkv, "dv");
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < len; ++i)
          ASSERT_NEAR(packed.lse[static_cast<size_t>((b * Hq + h) * S + s0 + i)],
                      alone.lse[static_cast<size_t>(h * len + i)], 1e-12);
      s0 += len;
    }
  }
}

TEST(AttentionPacked, DocumentsMatchSeparateRuns) {
  check_packed(2, 4, 2, 9, 4, {{3, 1, 5}, {9}});
  check_packed(2, 2, 1, 150, 8, {{70, 1, 79}, {20, 64, 66}});  // across tile borders, a one-token document
}

// Finite differences of sum(out * dout) for the chunk and document forms.
void check_grad(const ops::AttentionShape& p) {
  const auto dout = random_vec(p.B * p.Hq * p.S * p.D, 8);
  auto q = random_vec(p.B * p.Hq * p.S * p.D, 5, -2, 2), k = random_vec(p.B * p.Hkv * p.keys() * p.D, 6, -2, 2),
       v = random_vec(p.B * p.Hkv * p.keys() * p.D, 7);
  const Run r = run(p, q, k, v, dout);
  auto loss = [&] {
    std::vector<double> o(q.size()), l(r.lse.size());
    attention_forward(p, q.data(), k.data(), v.data(), o.data(), l.data());
    return test::dot(o, dout);
  };
  test::expect_grad("dq", q, r.dq, loss, {});
  test::expect_grad("dk", k, r.dk, loss, {});
  test::expect_grad("dv", v, r.dv, loss, {});
}

TEST(AttentionPacked, GradCheck) {
  ops::AttentionShape p = shape(2, 4, 2, 7, 4);
  const std::vector<int32_t> cu = cu_of({{2, 4, 1}, {5, 2}});
  p.cu_seqlens = cu.data();
  p.num_segments = 5;
  check_grad(p);
}

TEST(AttentionChunks, GradCheckAtOffsets) {
  // Queries at positions [6, 11) against keys [4, 10) of a sequence of 12: partly causal.
  ops::AttentionShape p = shape(2, 2, 1, 5, 4);
  p.Sk = 6;
  p.q_pos = 6;
  p.k_pos = 4;
  p.seq_total = 12;
  check_grad(p);
  // With documents: some rows see no key of this chunk at all.
  const std::vector<int32_t> cu = cu_of({{3, 6, 3}, {12}});
  p.cu_seqlens = cu.data();
  p.num_segments = 4;
  check_grad(p);
}

// A [B, H, S, D] float tensor's rows [s0, s0 + n) as a new tensor.
Tensor seq_rows(const Tensor& x, int64_t s0, int64_t n) {
  const int64_t BH = x.dim(0) * x.dim(1), S = x.dim(2), D = x.dim(3);
  Tensor y = Tensor::empty({x.dim(0), x.dim(1), n, D});
  for (int64_t h = 0; h < BH; ++h) y.flat_range(h * n * D, {n * D}).copy_from(x.flat_range((h * S + s0) * D, {n * D}));
  return y;
}
void add_rows(Tensor& x, const Tensor& part, int64_t s0) {
  const int64_t BH = x.dim(0) * x.dim(1), S = x.dim(2), D = x.dim(3), n = part.dim(2);
  for (int64_t h = 0; h < BH; ++h)
    for (int64_t i = 0; i < n * D; ++i) x.data<float>()[(h * S + s0) * D + i] += part.data<float>()[h * n * D + i];
}
double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
  return m;
}

// Ring attention on one process: the sequence cut into C chunks, each query chunk run against
// the key chunks at or before it and merged by log-sum-exp; backward per chunk pair from the
// merged out and lse, dq summed over key chunks and dk, dv over query chunks.
void check_chunks_in_sequence(int64_t C, const std::vector<int32_t>* cu) {
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 96, D = 8, L = S / C;
  ops::AttentionShape full = shape(B, Hq, Hkv, S, D);
  if (cu) {
    full.cu_seqlens = cu->data();
    full.num_segments = static_cast<int64_t>(cu->size()) - 1;
  }
  auto tensor = [](std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); };
  const Tensor q = tensor(random_vec<float>(B * Hq * S * D, 31, -2, 2), {B, Hq, S, D});
  const Tensor k = tensor(random_vec<float>(B * Hkv * S * D, 32, -2, 2), {B, Hkv, S, D});
  const Tensor v = tensor(random_vec<float>(B * Hkv * S * D, 33), {B, Hkv, S, D});
  const Tensor g = tensor(random_vec<float>(B * Hq * S * D, 34), {B, Hq, S, D});
  Tensor out, lse, dq, dk, dv;
  ops::attention_forward(full, q, k, v, out, lse);
  ops::attention_backward(full, q, k, v, out, lse, g, dq, dk, dv);

  Tensor cdq = Tensor::zeros(q.shape()), cdk = Tensor::zeros(k.shape()), cdv = Tensor::zeros(v.shape());
  for (int64_t qc = 0; qc < C; ++qc) {
    const Tensor qi = seq_rows(q, qc * L, L), gi = seq_rows(g, qc * L, L);
    auto pair = [&](int64_t kc) {
      ops::AttentionShape p = full;
      p.S = p.Sk = L;
      p.q_pos = qc * L;
      p.k_pos = kc * L;
      p.seq_total = S;
      return p;
    };
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
    EXPECT_LT(max_diff(o, seq_rows(out, qc * L, L)), 2e-6) << "chunk " << qc;
    EXPECT_LT(max_diff(l.view({B, Hq, L, 1}), seq_rows(lse.view({B, Hq, S, 1}), qc * L, L)), 2e-6);
    for (int64_t kc = 0; kc <= qc; ++kc) {
      Tensor gq, gk, gv;
      ops::attention_backward(pair(kc), qi, seq_rows(k, kc * L, L), seq_rows(v, kc * L, L), o, l, gi, gq, gk, gv);
      add_rows(cdq, gq, qc * L);
      add_rows(cdk, gk, kc * L);
      add_rows(cdv, gv, kc * L);
    }
  }
  EXPECT_LT(max_diff(cdq, dq), 2e-5);
  EXPECT_LT(max_diff(cdk, dk), 2e-5);
  EXPECT_LT(max_diff(cdv, dv), 2e-5);
}

TEST(AttentionChunks, InSequenceReproduceFullAttention) {
  check_chunks_in_sequence(2, nullptr);
  check_chunks_in_sequence(8, nullptr);
  const std::vector<int32_t> cu = cu_of({{10, 40, 1, 45}, {96}});
  check_chunks_in_sequence(4, &cu);
}

TEST(AttentionChunks, MergeIgnoresRowsWithoutKeys) {
  Tensor out = Tensor::from_vector(std::vector<float>{1, 2, 0, 0}, {1, 1, 2, 2});
  Tensor lse = Tensor::from_vector(std::vector<float>{0.5f, INFINITY}, {1, 1, 2});
  const Tensor po = Tensor::from_vector(std::vector<float>{7, 7, 3, 4}, {1, 1, 2, 2});
  const Tensor pl = Tensor::from_vector(std::vector<float>{INFINITY, 1.5f}, {1, 1, 2});
  ops::attention_merge(out, lse, po, pl);
  EXPECT_EQ(out.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(lse.to_vector(), (std::vector<float>{0.5f, 1.5f}));
}

TEST(AttentionPacked, BitIdenticalAcrossThreadCounts) {
  ops::AttentionShape p = shape(2, 4, 1, 150, 16);
  const std::vector<int32_t> cu = cu_of({{30, 100, 20}, {149, 1}});
  p.cu_seqlens = cu.data();
  p.num_segments = 5;
  const auto q = test::to_float(random_vec(2 * 4 * 150 * 16, 41, -2, 2)),
             k = test::to_float(random_vec(2 * 150 * 16, 42, -2, 2)), v = test::to_float(random_vec(2 * 150 * 16, 43)),
             g = test::to_float(random_vec(2 * 4 * 150 * 16, 44));
  auto go = [&](int threads) {
    std::vector<float> out(q.size()), lse(2 * 4 * 150), dq(q.size()), dk(k.size()), dv(v.size());
    test::with_threads(threads, [&] {
      attention_forward(p, q.data(), k.data(), v.data(), out.data(), lse.data());
      attention_backward(p, q.data(), k.data(), v.data(), out.data(), lse.data(), g.data(), dq.data(), dk.data(),
                         dv.data());
    });
    return std::vector<std::vector<float>>{out, lse, dq, dk, dv};
  };
  const auto one = go(1), two = go(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], two[i])) << "tensor " << i;
}

}  // namespace
}  // namespace mt::cpu
