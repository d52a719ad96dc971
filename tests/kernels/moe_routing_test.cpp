// MoE routing and permutation on the CPU: the routing rules of kernels/moe_routing.h on hand-made
// cases, every gradient against fp64 finite differences, token dropping as Megatron's policy
// drops, and the dispatch order.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/moe.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt {
namespace {

using Spec = ops::RouterSpec;

std::vector<int32_t> route(const std::vector<double>& l, const Spec& sp, std::vector<double>& probs,
                           const float* bias = nullptr) {
  const int64_t n = static_cast<int64_t>(l.size()) / sp.num_experts;
  probs.assign(l.size(), 0.0);
  std::vector<int32_t> sel(l.size());
  cpu::moe_route(l.data(), bias, sp, n, probs.data(), sel.data());
  return sel;
}

TEST(MoERoute, SoftmaxOverTheTopKLogits) {
  // Token 0: logits 1, 3, 2, 0 -> experts 1 and 2, softmax over (3, 2).
  std::vector<double> l = {1, 3, 2, 0}, p;
  auto sel = route(l, test::router_spec(4, 2), p);
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 1, 0}));
  const double e = std::exp(1.0);
  EXPECT_NEAR(p[1], e / (e + 1), 1e-12);
  EXPECT_NEAR(p[2], 1 / (e + 1), 1e-12);
  EXPECT_EQ(p[0], 0.0);
}

TEST(MoERoute, PreSoftmaxKeepsTheFullSoftmaxWeights) {
  std::vector<double> l = {1, 3, 2, 0}, p;
  Spec sp = test::router_spec(4, 2);
  sp.pre_softmax = true;
  route(l, sp, p);
  double z = 0;
  for (double x : l) z += std::exp(x);
  EXPECT_NEAR(p[1], std::exp(3.0) / z, 1e-12);
  EXPECT_NEAR(p[2], std::exp(2.0) / z, 1e-12);
}

TEST(MoERoute, SigmoidWithExpertBiasMovesTheChoiceNotTheWeights) {
  std::vector<double> l = {0.5, 0.4, -1.0, 0.1}, p;
  const float bias[4] = {0.f, 0.f, 1.f, 0.f};  // expert 2 wins the choice through its bias
  auto sel = route(l, test::router_spec(4, 2, Spec::Score::Sigmoid), p, bias);
  EXPECT_EQ(sel, (std::vector<int32_t>{1, 0, 1, 0}));
  auto sg = [](double x) { return 1 / (1 + std::exp(-x)); };
  const double z = sg(0.5) + sg(-1.0) + 1e-20;
  EXPECT_NEAR(p[0], sg(0.5) / z, 1e-12);
  EXPECT_NEAR(p[2], sg(-1.0) / z, 1e-12);
}

TEST(MoERoute, GroupLimitedRoutingStaysInTheBestGroups) {
  // 8 experts in 4 groups of 2, top-2 from 2 groups, each group scored by its best expert.
  // Group sums: g0 = 5, g1 = 4.5, g2 = 6, g3 = 1 -> groups 2 and 0; expert 3 (4.5) is out.
  std::vector<double> l = {5, 0, 4.5, 4.4, 6, 0, 1, 0}, p;
  Spec sp = test::router_spec(8, 2);
  sp.num_groups = 4;
  sp.group_topk = 2;
  auto sel = route(l, sp, p);
  EXPECT_EQ(sel, (std::vector<int32_t>{1, 0, 0, 0, 1, 0, 0, 0}));
}

TEST(MoERoute, ScalingFactorMultipliesTheWeights) {
  std::vector<double> l = {1, 3, 2, 0}, p, q;
  Spec sp = test::router_spec(4, 2);
  route(l, sp, p);
  sp.scaling = 2.5f;
  route(l, sp, q);
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(q[i], 2.5 * p[i], 1e-12);
}

TEST(MoERoute, SinkhornBalancesTheChoice) {
  // Every token prefers expert 0; Sinkhorn's balanced scores spread them over both experts.
  std::vector<double> l = {2.0, 0.0, 2.1, 0.0, 1.9, 0.0, 2.2, 0.0}, p;
  Spec sp = test::router_spec(2, 1);
  sp.sinkhorn = true;
  auto sel = route(l, sp, p);
  int c0 = 0;
  for (int t = 0; t < 4; ++t) c0 += sel[t * 2];
  EXPECT_EQ(c0, 2);
  for (int t = 0; t < 4; ++t)
    for (int e = 0; e < 2; ++e)
      if (sel[t * 2 + e]) {
        EXPECT_NEAR(p[t * 2 + e], 1 / (1 + std::exp(-l[t * 2 + e])), 1e-12);
      }
}

// d(sum w * probs)/dlogits for every routing mode, against finite differences.
TEST(MoERoute, GradientsMatchFiniteDifferences) {
  struct Mode {
    const char* name;
    Spec sp;
  };
  std::vector<Mode> modes;
  modes.push_back({"softmax", test::router_spec(6, 2)});
  Spec pre = test::router_spec(6, 2);
  pre.pre_softmax = true;
  modes.push_back({"pre_softmax", pre});
  modes.push_back({"sigmoid_k2", test::router_spec(6, 2, Spec::Score::Sigmoid)});
  modes.push_back({"sigmoid_k1", test::router_spec(6, 1, Spec::Score::Sigmoid)});
  Spec scaled = test::router_spec(6, 3);
  scaled.scaling = 1.7f;
  modes.push_back({"softmax_scaled", scaled});
  Spec grouped = test::router_spec(6, 2, Spec::Score::Sigmoid);
  grouped.num_groups = 3;
  grouped.group_topk = 2;
  modes.push_back({"sigmoid_grouped", grouped});
  for (int64_t k : {1, 2}) {
    Spec sk = test::router_spec(6, k);
    sk.sinkhorn = true;
    modes.push_back({k == 1 ? "sinkhorn_k1" : "sinkhorn_k2", sk});
  }
  const int64_t n = 5;
  for (const Mode& m : modes) {
    SCOPED_TRACE(m.name);
    const int64_t E = m.sp.num_experts;
    std::vector<double> l = test::random_vec(n * E, 11, -2, 2), w = test::random_vec(n * E, 12), p;
    const auto sel = route(l, m.sp, p);
    std::vector<double> dl(l.size());
    cpu::moe_route_backward(l.data(), sel.data(), w.data(), m.sp, n, dl.data());
    auto loss = [&] {
      std::vector<double> q(l.size());
      std::vector<int32_t> s2(l.size());
      cpu::moe_route(l.data(), nullptr, m.sp, n, q.data(), s2.data());
      if (s2 != sel) ADD_FAILURE() << "the finite-difference step changed the routing";
      return test::dot(q, w);
    };
    test::expect_grad(m.name, l, dl, loss);
  }
}

// The load-balancing losses are linear in the aux scores once counts are fixed: the gradient of
// sum coef * score_sums + z * z_sum.
TEST(MoEAux, GradientsMatchFiniteDifferences) {
  for (auto score : {Spec::Score::Softmax, Spec::Score::Sigmoid}) {
    const int64_t E = 4, n = 6, B = 2;
    Spec sp = test::router_spec(E, 2, score);
    std::vector<double> l = test::random_vec(n * E, 21, -2, 2), coef = test::random_vec(B * E, 22);
    const double z = 0.37;
    std::vector<double> dl(l.size(), 0.0);
    cpu::moe_aux_backward(l.data(), sp, n, B, coef.data(), z, dl.data());
    auto loss = [&] {
      std::vector<double> sums(B * E), counts(B * E);
      double zs = 0;
      cpu::moe_aux_stats(l.data(), sp, n, B, sums.data(), counts.data(), &zs);
      return test::dot(sums, coef) + z * zs;
    };
    test::expect_grad(score == Spec::Score::Softmax ? "aux_softmax" : "aux_sigmoid", l, dl, loss);
  }
}

TEST(MoEAux, StatsCountEachSequencesTopK) {
  // 2 sequences (B = 2), 2 positions: tokens 0, 2 are sequence 0; 1, 3 sequence 1.
  const int64_t E = 3, n = 4, B = 2;
  std::vector<double> l = {3, 2, 0, 0, 3, 2, 3, 0, 2, 2, 0, 3}, sums(B * E), counts(B * E);
  double z = 0;
  cpu::moe_aux_stats(l.data(), test::router_spec(E, 2), n, B, sums.data(), counts.data(), &z);
  EXPECT_EQ(counts, (std::vector<double>{2, 1, 1, 1, 1, 2}));  // b0: t0 {0,1}, t2 {0,2}; b1: t1 {1,2}, t3 {2,0}
  double sum = 0;
  for (int b = 0; b < B; ++b)
    for (int e = 0; e < E; ++e) sum += sums[b * E + e];
  EXPECT_NEAR(sum, 4.0, 1e-12);  // softmax rows sum to one
}

TEST(MoECapacity, DropsTheLowestProbsOrTheLatestTokens) {
  // 4 tokens, 2 experts, top-1 each: expert 0 gets tokens 0, 1, 2 (probs .6 .9 .7), expert 1 token 3.
  const int64_t n = 4, E = 2;
  const std::vector<int32_t> sel = {1, 0, 1, 0, 1, 0, 0, 1};
  const std::vector<float> p0 = {.6f, 0, .9f, 0, .7f, 0, 0, .8f};
  {
    std::vector<float> p = p0;
    std::vector<int32_t> map(n * E);
    cpu::moe_capacity(p.data(), sel.data(), n, E, 2, false, false, map.data());
    EXPECT_EQ(map, (std::vector<int32_t>{0, 0, 1, 0, 1, 0, 0, 1}));  // token 0 (0.6) dropped
    EXPECT_EQ(p[0], 0.f);
    EXPECT_EQ(p[2], .9f);
  }
  {
    std::vector<float> p = p0;
    std::vector<int32_t> map(n * E);
    cpu::moe_capacity(p.data(), sel.data(), n, E, 2, true, false, map.data());
    EXPECT_EQ(map, (std::vector<int32_t>{1, 0, 1, 0, 0, 0, 0, 1}));  // token 2 (the latest) dropped
  }
  {
    std::vector<float> p = p0;
    std::vector<int32_t> map(n * E);
    cpu::moe_capacity(p.data(), sel.data(), n, E, 2, false, true, map.data());
    // Padded: expert 1 takes token 3 and, at weight 0, token 0 (the first of the unselected).
    // Expert 0 keeps tokens 1 and 2 (token 0 dropped, as without padding).
    EXPECT_EQ(map, (std::vector<int32_t>{0, 1, 1, 0, 1, 0, 0, 1}));
    EXPECT_EQ(p[0 * E + 1], 0.f);
    EXPECT_EQ(p[0 * E + 0], 0.f);
  }
}

TEST(MoEDispatch, ExpertMajorRowsAndTheirInverse) {
  // map: t0 -> e1, e2; t1 -> e0, e2; t2 -> e1.
  const std::vector<int32_t> m = {0, 1, 1, 1, 0, 1, 0, 1, 0};
  Tensor map = Tensor::from_vector(m, {3, 3}), counts;
  Tensor rows = ops::moe_dispatch_plan(map, counts);
  const int32_t* r = rows.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(r, r + 9), (std::vector<int32_t>{-1, 1, 3, 0, -1, 4, -1, 2, -1}));
  EXPECT_EQ(std::vector<int32_t>(counts.data<int32_t>(), counts.data<int32_t>() + 3),
            (std::vector<int32_t>{1, 2, 2}));
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor xp = ops::moe_permute(x, rows, 5);
  EXPECT_EQ(std::vector<float>(xp.data<float>(), xp.data<float>() + 10),
            (std::vector<float>{3, 4, 1, 2, 5, 6, 1, 2, 3, 4}));
  // Unpermute with weights, and its backward: dyp = p * dy, dprobs = <dy, yp>.
  Tensor probs = Tensor::from_vector(std::vector<float>{0, .25f, .75f, .5f, 0, .5f, 0, 1, 0}, {3, 3});
  Tensor y = ops::moe_unpermute(xp, rows, probs);
  EXPECT_EQ(std::vector<float>(y.data<float>(), y.data<float>() + 6), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor dy = Tensor::from_vector(std::vector<float>{1, -1, 2, 0, 0, 3}, {3, 2}), dprobs;
  Tensor dyp = ops::moe_unpermute_backward(dy, xp, rows, probs, dprobs);
  EXPECT_FLOAT_EQ(dprobs.data<float>()[0 * 3 + 1], 1 * 1 + -1 * 2);  // t0, e1 row = x0
  EXPECT_FLOAT_EQ(dprobs.data<float>()[1 * 3 + 0], 2 * 3);           // t1, e0 row = x1
  EXPECT_FLOAT_EQ(dyp.data<float>()[1 * 2 + 0], .25f * 1);           // row 1 is (t0, e1)
  EXPECT_FLOAT_EQ(dyp.data<float>()[3 * 2 + 1], .75f * -1);          // row 3 is (t0, e2)
  Tensor dx = ops::moe_permute_backward(xp, rows);  // each token's rows summed
  EXPECT_EQ(std::vector<float>(dx.data<float>(), dx.data<float>() + 6), (std::vector<float>{2, 4, 6, 8, 5, 6}));
}

TEST(MoESharedGate, GradientMatchesFiniteDifferences) {
  const int64_t n = 3, h = 4;
  std::vector<double> xg = test::random_vec(n * h + n, 31);
  auto eval = [&](Tensor* dx, Tensor* dgate, const std::vector<float>& dyv) {
    Tensor x = Tensor::from_vector(std::vector<float>(xg.begin(), xg.begin() + n * h), {n, h});
    Tensor g = Tensor::from_vector(std::vector<float>(xg.begin() + n * h, xg.end()), {n, 1});
    Tensor y = ops::sigmoid_gate_rows(x, g);
    double s = 0;
    for (int64_t i = 0; i < n * h; ++i) s += static_cast<double>(y.data<float>()[i]) * dyv[i];
    if (dx) *dx = ops::sigmoid_gate_rows_backward(Tensor::from_vector(dyv, {n, h}), x, g, *dgate);
    return s;
  };
  const auto dyv = test::to_float(test::random_vec(n * h, 32));
  Tensor dx, dgate;
  eval(&dx, &dgate, dyv);
  std::vector<double> analytic(xg.size());
  for (int64_t i = 0; i < n * h; ++i) analytic[i] = dx.data<float>()[i];
  for (int64_t t = 0; t < n; ++t) analytic[n * h + t] = dgate.data<float>()[t];
  test::expect_grad("sigmoid_gate_rows", xg, analytic, [&] { return eval(nullptr, nullptr, dyv); }, {}, 2e-2, 1e-2);
}

}  // namespace
}  // namespace mt
