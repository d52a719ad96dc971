// The fused, chunked CPU output layer + cross-entropy (cpu/output_loss.cpp) against the unfused
// reference (linear_forward, cross_entropy_forward/backward, linear_backward): the same losses
// and gradients within fp32 rounding, finite-difference gradients in fp64, the same bits for any
// thread count, and the softmax rows' vector clones giving the baseline's bits.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/output_loss.h"
#include "kernels/cpu/softmax_rows.h"
#include "kernels/cpu/vec_math.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

// A head of N rows, hidden H, vocabulary V (valid_v real columns) with random weights; targets
// spread over the real columns, dloss as a loss mask times a scale would give.
template <typename T>
struct Head {
  int64_t N, V, H, valid_v;
  std::vector<T> x, w, dloss;
  std::vector<int32_t> targets;
  Head(int64_t n, int64_t v, int64_t h, int64_t vv, uint64_t seed) : N(n), V(v), H(h), valid_v(vv) {
    x = random_vec<T>(N * H, seed, -2, 2);
    w = random_vec<T>(V * H, seed + 1, -1, 1);
    dloss = random_vec<T>(N, seed + 2, 0.0, 0.01);
    dloss[0] = 0;  // a masked token
    for (int64_t i = 0; i < N; ++i) targets.push_back(static_cast<int32_t>((i * 7919 + 13) % valid_v));
  }
  OutputLoss<T> args(std::vector<T>* dx, std::vector<T>* dw, bool accumulate = true) const {
    OutputLoss<T> p;
    p.x = x.data();
    p.w = w.data();
    p.targets = targets.data();
    p.N = N;
    p.V = V;
    p.H = H;
    p.valid_v = valid_v;
    if (dx) {
      p.dloss = dloss.data();
      p.dx = dx->data();
      p.dw = dw->data();
      p.accumulate_dw = accumulate;
    }
    return p;
  }
};

// Three row chunks (the last partial) and three vocabulary tiles, the last wholly padding.
const int64_t kN = 300, kV = 1100, kH = 40, kValid = 1000;

TEST(OutputLoss, MatchesUnfusedReference) {
  const Head<float> h(kN, kV, kH, kValid, 1);
  // Reference: the logits in full, the loss and its gradient, the two backward GEMMs.
  std::vector<float> logits(kN * kV), losses(kN), lse(kN), dlogits(kN * kV), dx(kN * kH);
  std::vector<float> dw = random_vec<float>(kV * kH, 9);  // accumulated onto
  linear_forward(h.x.data(), h.w.data(), nullptr, logits.data(), kN, kV, kH);
  cross_entropy_forward(logits.data(), h.targets.data(), losses.data(), lse.data(), kN, kV, kValid);
  cross_entropy_backward(logits.data(), h.targets.data(), lse.data(), h.dloss.data(), dlogits.data(), kN, kV, kValid);
  linear_backward(dlogits.data(), h.x.data(), h.w.data(), dx.data(), dw.data(), nullptr, kN, kV, kH);

  std::vector<float> f_losses(kN), f_lse(kN), f_dx(kN * kH, NAN), f_dw = random_vec<float>(kV * kH, 9);
  output_loss(h.args(&f_dx, &f_dw), f_losses.data(), f_lse.data());
  EXPECT_LT(test::max_rel_err(f_losses, losses), 1e-6);
  EXPECT_LT(test::max_rel_err(f_lse, lse), 1e-6);
  EXPECT_LT(test::max_rel_err(f_dx, dx), 1e-5);
  EXPECT_LT(test::max_rel_err(f_dw, dw), 1e-5);
  // The padded columns' weight rows get no gradient: they keep what they held.
  const auto before = random_vec<float>(kV * kH, 9);
  for (int64_t i = kValid * kH; i < kV * kH; ++i) ASSERT_EQ(f_dw[i], before[i]) << i;

  // The step's first write (accumulate_dw = false) ignores what dw held; the loss alone
  // (evaluation) gives the training pass's losses bit for bit.
  std::vector<float> o_dx(kN * kH), o_dw(kV * kH, 1e30f), e_losses(kN), e_lse(kN);
  output_loss(h.args(&o_dx, &o_dw, false), f_losses.data(), f_lse.data());
  for (int64_t i = 0; i < kV * kH; ++i) ASSERT_NEAR(o_dw[i], f_dw[i] - before[i], 1e-5) << i;
  output_loss(h.args(nullptr, nullptr), e_losses.data(), e_lse.data());
  EXPECT_TRUE(test::bit_equal(e_losses, f_losses));
  EXPECT_TRUE(test::bit_equal(e_lse, f_lse));
}

TEST(OutputLoss, GradCheckInDouble) {
  // Two row chunks would need 129 rows; the chunk boundary is covered above. Two vocabulary tiles.
  Head<double> h(6, 530, 3, 520, 2);
  std::vector<double> losses(h.N), lse(h.N), dx(h.N * h.H), dw(h.V * h.H, 0.0);
  output_loss(h.args(&dx, &dw), losses.data(), lse.data());
  auto loss = [&] {
    std::vector<double> l(h.N), s(h.N);
    output_loss(h.args(nullptr, nullptr), l.data(), s.data());
    return test::dot(l, h.dloss);
  };
  test::expect_grad("dx", h.x, dx, loss);
  test::expect_grad("dw", h.w, dw, loss, test::sample_indices(dw.size(), 300, 3));
}

TEST(OutputLoss, BitIdenticalAcrossThreadCounts) {
  const Head<float> h(kN, kV, kH, kValid, 4);
  auto run = [&](int threads) {
    std::vector<float> losses(kN), lse(kN), dx(kN * kH), dw = random_vec<float>(kV * kH, 5);
    test::with_threads(threads, [&] { output_loss(h.args(&dx, &dw), losses.data(), lse.data()); });
    return std::vector<std::vector<float>>{losses, lse, dx, dw};
  };
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], many[i])) << threads << " " << i;
  }
}

// exp_sum_row runs the widest vector clone this CPU has; the baseline 16-byte code must agree.
TEST(OutputLoss, SoftmaxRowClonesGiveBaselineBits) {
  for (int64_t n : {0, 1, 15, 16, 17, 100, 515}) {
    auto row = random_vec<float>(n, 6 + n, -30, 30);
    auto want = row;
    float m = -std::numeric_limits<float>::infinity();
    for (float v : want) m = std::max(m, v);
    vec::exp_shifted<float, 16>(want.data(), n, m);
    const ExpSum got = exp_sum_row(row.data(), n);
    EXPECT_EQ(got.max, static_cast<double>(m)) << n;
    EXPECT_EQ(got.sum, vec::sum_lanes(want.data(), n)) << n;
    EXPECT_TRUE(test::bit_equal(row, want)) << n;
  }
}

}  // namespace
}  // namespace mt::cpu
