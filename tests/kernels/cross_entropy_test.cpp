// Softmax cross-entropy with vocab padding: values, finite-difference gradients (padded
// columns must neither count nor receive gradient), thread-count invariance, and the fused
// Tensor op's CPU path (the forward and backward ops composed).
#include <cmath>
#include <limits>

#include "core/tensor.h"
#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

// Padded columns hold large values: if they leaked into the softmax the loss would show it.
std::vector<double> padded_logits(int64_t N, int64_t V, int64_t valid_v, uint64_t seed) {
  auto l = random_vec(N * V, seed, -3, 3);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = valid_v; j < V; ++j) l[n * V + j] = 50.0;
  return l;
}

TEST(CrossEntropy, ForwardMatchesNaive) {
  const int64_t N = 6, V = 16, valid_v = 11;
  auto logits = padded_logits(N, V, valid_v, 1);
  const std::vector<int32_t> targets = {0, 10, 3, 7, 3, 5};
  std::vector<double> losses(N), lse(N);
  cross_entropy_forward(logits.data(), targets.data(), losses.data(), lse.data(), N, V, valid_v);
  auto lf = test::to_float(logits);
  std::vector<float> lossesf(N), lsef(N);
  cross_entropy_forward(lf.data(), targets.data(), lossesf.data(), lsef.data(), N, V, valid_v);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t j = 0; j < valid_v; ++j) s += std::exp(logits[n * V + j]);
    EXPECT_NEAR(lse[n], std::log(s), 1e-14);
    EXPECT_NEAR(losses[n], std::log(s) - logits[n * V + targets[n]], 1e-14);
    EXPECT_NEAR(lossesf[n], losses[n], 2e-6);
  }
}

TEST(CrossEntropy, GradCheckWithPaddedVocab) {
  const int64_t N = 4, V = 9, valid_v = 7;
  auto logits = padded_logits(N, V, valid_v, 2);
  const std::vector<int32_t> targets = {6, 0, 2, 2};
  const auto dloss = random_vec(N, 3, 0.5, 2.0);  // per-token weights, as a loss mask would give
  std::vector<double> losses(N), lse(N), dlogits(N * V, 7.0);
  cross_entropy_forward(logits.data(), targets.data(), losses.data(), lse.data(), N, V, valid_v);
  cross_entropy_backward(logits.data(), targets.data(), lse.data(), dloss.data(), dlogits.data(), N, V, valid_v);
  for (int64_t n = 0; n < N; ++n) {
    double row = 0;
    for (int64_t j = 0; j < V; ++j) row += dlogits[n * V + j];
    EXPECT_NEAR(row, 0.0, 1e-14);  // softmax minus one-hot sums to zero
    for (int64_t j = valid_v; j < V; ++j) EXPECT_EQ(dlogits[n * V + j], 0.0);
  }
  test::expect_grad("dlogits", logits, dlogits, [&] {
    std::vector<double> l(N), s(N);
    cross_entropy_forward(logits.data(), targets.data(), l.data(), s.data(), N, V, valid_v);
    return test::dot(l, dloss);
  });
}

TEST(CrossEntropy, BitIdenticalAcrossThreadCounts) {
  const int64_t N = 256, V = 1024, valid_v = 1000;
  auto logits = random_vec<float>(N * V, 4, -5, 5);
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n) targets[n] = static_cast<int32_t>((n * 37) % valid_v);
  const std::vector<float> dloss(N, 1.f / N);
  auto run = [&](int threads) {
    std::vector<float> losses(N), lse(N), dlogits(N * V);
    test::with_threads(threads, [&] {
      cross_entropy_forward(logits.data(), targets.data(), losses.data(), lse.data(), N, V, valid_v);
      cross_entropy_backward(logits.data(), targets.data(), lse.data(), dloss.data(), dlogits.data(), N, V, valid_v);
    });
    return std::vector<std::vector<float>>{losses, lse, dlogits};
  };
  const auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(test::bit_equal(one[i], two[i])) << i;
}

TEST(CrossEntropy, FusedOpOnCpuIsForwardThenBackward) {
  const int64_t N = 5, V = 37;
  const auto logits = random_vec<float>(N * V, 5, -4, 4);
  const std::vector<int32_t> targets = {0, 36, 18, 7, 7};
  const std::vector<float> dloss = {0.25f, 1.f, 0.f, 2.f, 0.5f};  // row 2 masked
  const Tensor tl = Tensor::from_vector(logits, {N, V}), tt = Tensor::from_vector(targets, {N}),
               td = Tensor::from_vector(dloss, {N});
  Tensor losses, lse;
  const Tensor d = ops::cross_entropy_fused(tl, tt, td, losses, lse);
  std::vector<float> want_loss(N), want_lse(N), want_d(N * V);
  cross_entropy_forward(logits.data(), targets.data(), want_loss.data(), want_lse.data(), N, V, V);
  cross_entropy_backward(logits.data(), targets.data(), want_lse.data(), dloss.data(), want_d.data(), N, V, V);
  EXPECT_TRUE(test::bit_equal(losses.to_vector(), want_loss));
  EXPECT_TRUE(test::bit_equal(lse.to_vector(), want_lse));
  EXPECT_TRUE(test::bit_equal(d.to_vector(), want_d));
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(d.to_vector()[2 * V + j], 0.f);
  EXPECT_TRUE(test::bit_equal(tl.to_vector(), logits));  // the CPU op leaves the logits alone
}

}  // namespace
}  // namespace mt::cpu
