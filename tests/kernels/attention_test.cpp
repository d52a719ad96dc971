// Tiled online-softmax attention against a plain softmax(QK^T)V with the full matrix, finite
// differences for the backward, and thread-count invariance.
#include <cmath>
#include <limits>

#include "core/philox.h"
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

struct Naive {
  std::vector<double> out, lse;
};

// Full S x S scores per head, softmax, dropout from the documented Philox key, times V.
Naive naive_attention(const ops::AttentionShape& p, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v) {
  const int64_t S = p.S, D = p.D, group = p.Hq / p.Hkv;
  Naive r{std::vector<double>(q.size()), std::vector<double>(p.B * p.Hq * S)};
  std::vector<double> prob(S);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h) {
      const int64_t bh = b * p.Hq + h, kvh = b * p.Hkv + h / group;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = p.causal ? i + 1 : S;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += q[(bh * S + i) * D + d] * k[(kvh * S + j) * D + d];
          prob[j] = s * static_cast<double>(p.scale);
          mx = std::max(mx, prob[j]);
        }
        double l = 0;
        for (int64_t j = 0; j < n; ++j) l += std::exp(prob[j] - mx);
        r.lse[bh * S + i] = mx + std::log(l);
        for (int64_t j = 0; j < n; ++j) {
          double pij = std::exp(prob[j] - mx) / l;
          if (p.dropout_p > 0.f) {
            const float u = Philox::uniform(p.seed, p.offset, static_cast<uint64_t>((bh * S + i) * S + j));
            pij = u >= p.dropout_p ? pij / (1.0 - static_cast<double>(p.dropout_p)) : 0.0;
          }
          for (int64_t d = 0; d < D; ++d) r.out[(bh * S + i) * D + d] += pij * v[(kvh * S + j) * D + d];
        }
      }
    }
  return r;
}

ops::AttentionShape make_params(int64_t B, int64_t Hq, int64_t Hkv, int64_t S, int64_t D, bool causal,
                                float drop = 0.f) {
  ops::AttentionShape p{B, Hq, Hkv, S, D, 1.f / std::sqrt(static_cast<float>(D))};
  p.causal = causal;
  p.dropout_p = drop;
  p.seed = 4242;
  p.offset = 17;
  return p;
}

struct Inputs {
  std::vector<double> q, k, v, dout;
  explicit Inputs(const ops::AttentionShape& p, uint64_t seed)
      : q(random_vec(p.B * p.Hq * p.S * p.D, seed, -2, 2)),
        k(random_vec(p.B * p.Hkv * p.S * p.D, seed + 1, -2, 2)),
        v(random_vec(p.B * p.Hkv * p.S * p.D, seed + 2)),
        dout(random_vec(p.B * p.Hq * p.S * p.D, seed + 3)) {}
};

void check_forward(const ops::AttentionShape& p) {
  SCOPED_TRACE(testing::Message() << "B=" << p.B << " Hq=" << p.Hq << " Hkv=" << p.Hkv << " S=" << p.S
                                  << " D=" << p.D << " causal=" << p.causal << " p=" << p.dropout_p);
  Inputs in(p, 11);
  const Naive ref = naive_attention(p, in.q, in.k, in.v);
  std::vector<double> out(in.q.size()), lse(ref.lse.size());
  attention_forward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  EXPECT_LT(test::max_rel_err(out, ref.out), 1e-13);
  EXPECT_LT(test::max_rel_err(lse, ref.lse), 1e-14);
  auto qf = test::to_float(in.q), kf = test::to_float(in.k), vf = test::to_float(in.v);
  std::vector<float> outf(out.size()), lsef(lse.size());
  attention_forward(p, qf.data(), kf.data(), vf.data(), outf.data(), lsef.data());
  EXPECT_LT(test::max_rel_err(outf, ref.out), 2e-6);
  EXPECT_LT(test::max_rel_err(lsef, ref.lse), 1e-6);
}

TEST(Attention, ForwardMatchesNaive) {
  check_forward(make_params(2, 4, 2, 150, 16, true));   // several tiles, a ragged last one, GQA
  check_forward(make_params(1, 2, 1, 70, 8, false));    // MQA, non-causal
  check_forward(make_params(1, 3, 3, 64, 8, true));     // exactly one tile
  check_forward(make_params(2, 2, 2, 5, 4, true));      // smaller than a tile
  check_forward(make_params(1, 2, 1, 67, 12, true));    // head dim not a multiple of the vector block
  check_forward(make_params(1, 4, 2, 130, 8, true, 0.25f));
  check_forward(make_params(1, 2, 2, 90, 8, false, 0.5f));
}

// Gradient of L = sum(out * dout) by finite differences, against attention_backward.
void check_grad(const ops::AttentionShape& p, size_t samples = 0) {
  SCOPED_TRACE(testing::Message() << "B=" << p.B << " Hq=" << p.Hq << " Hkv=" << p.Hkv << " S=" << p.S
                                  << " D=" << p.D << " causal=" << p.causal << " p=" << p.dropout_p);
  Inputs in(p, 5);
  std::vector<double> out(in.q.size()), lse(p.B * p.Hq * p.S);
  attention_forward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  attention_backward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), in.dout.data(), dq.data(),
                     dk.data(), dv.data());
  auto loss = [&] {
    std::vector<double> o(in.q.size()), l(lse.size());
    attention_forward(p, in.q.data(), in.k.data(), in.v.data(), o.data(), l.data());
    return test::dot(o, in.dout);
  };
  auto pick = [&](size_t n, uint64_t s) {
    return samples ? test::sample_indices(n, samples, s) : std::vector<size_t>{};
  };
  test::expect_grad("dq", in.q, dq, loss, pick(in.q.size(), 1));
  test::expect_grad("dk", in.k, dk, loss, pick(in.k.size(), 2));
  test::expect_grad("dv", in.v, dv, loss, pick(in.v.size(), 3));
}

TEST(Attention, GradCheckMha) { check_grad(make_params(2, 2, 2, 7, 4, true)); }
// D = 6 also covers head dims that are not a whole number of vector blocks.
TEST(Attention, GradCheckGqa) { check_grad(make_params(2, 4, 2, 6, 6, true)); }
TEST(Attention, GradCheckMqa) { check_grad(make_params(1, 4, 1, 6, 4, true)); }
TEST(Attention, GradCheckNonCausal) { check_grad(make_params(2, 4, 2, 6, 4, false)); }
TEST(Attention, GradCheckDropout) {
  check_grad(make_params(2, 4, 2, 7, 4, true, 0.3f));
  check_grad(make_params(1, 2, 1, 6, 4, false, 0.5f));
}
TEST(Attention, GradCheckSeveralTiles) {
  check_grad(make_params(1, 2, 1, 130, 4, true), 80);
  check_grad(make_params(1, 2, 2, 100, 4, false, 0.2f), 80);
}

// Parameter order is fixed per output element, so 1, 2 and 3 threads agree bit for bit. With
// B*Hkv = 2 one thread takes the fused backward schedule and more threads the split one: this
// also checks that both schedules produce identical bits.
TEST(Attention, BitIdenticalAcrossThreadCounts) {
  for (float drop : {0.f, 0.1f}) {
    const ops::AttentionShape p = make_params(2, 4, 1, 150, 16, true, drop);
    Inputs in(p, 9);
    auto qf = test::to_float(in.q), kf = test::to_float(in.k), vf = test::to_float(in.v),
         gf = test::to_float(in.dout);
    auto run = [&](int threads) {
      std::vector<float> out(qf.size()), lse(p.B * p.Hq * p.S), dq(qf.size()), dk(kf.size()), dv(vf.size());
      test::with_threads(threads, [&] {
        attention_forward(p, qf.data(), kf.data(), vf.data(), out.data(), lse.data());
        attention_backward(p, qf.data(), kf.data(), vf.data(), out.data(), lse.data(), gf.data(), dq.data(),
                           dk.data(), dv.data());
      });
      return std::vector<std::vector<float>>{out, lse, dq, dk, dv};
    };
    const auto one = run(1);
    for (int t : {2, 3}) {
      const auto many = run(t);
      for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], many[i])) << "tensor " << i << " threads " << t;
    }
  }
}

// The fp32 path is the same template: its gradients agree with fp64 to fp32 accuracy.
TEST(Attention, FloatBackwardMatchesDouble) {
  const ops::AttentionShape p = make_params(2, 4, 2, 150, 20, true, 0.1f);
  Inputs in(p, 21);
  std::vector<double> out(in.q.size()), lse(p.B * p.Hq * p.S), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  attention_forward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  attention_backward(p, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), in.dout.data(), dq.data(),
                     dk.data(), dv.data());
  auto qf = test::to_float(in.q), kf = test::to_float(in.k), vf = test::to_float(in.v), gf = test::to_float(in.dout);
  std::vector<float> outf(qf.size()), lsef(lse.size()), dqf(qf.size()), dkf(kf.size()), dvf(vf.size());
  attention_forward(p, qf.data(), kf.data(), vf.data(), outf.data(), lsef.data());
  attention_backward(p, qf.data(), kf.data(), vf.data(), outf.data(), lsef.data(), gf.data(), dqf.data(), dkf.data(),
                     dvf.data());
  EXPECT_LT(test::max_rel_err(dqf, dq), 1e-5);
  EXPECT_LT(test::max_rel_err(dkf, dk), 1e-5);
  EXPECT_LT(test::max_rel_err(dvf, dv), 1e-5);
}

}  // namespace
}  // namespace mt::cpu
