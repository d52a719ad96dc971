// Embedding lookup and its scatter-add backward (repeated ids, accumulation, determinism).
#include "kernels/cpu/ops.h"
#include "test_util.h"

namespace mt::cpu {
namespace {

using test::random_vec;

TEST(Embedding, ForwardGathersRows) {
  const int64_t V = 6, dim = 5;
  const std::vector<int32_t> ids = {3, 0, 5, 3};
  auto table = random_vec(V * dim, 1);
  std::vector<double> out(ids.size() * dim);
  embedding_forward(ids.data(), table.data(), out.data(), static_cast<int64_t>(ids.size()), dim);
  for (size_t n = 0; n < ids.size(); ++n)
    for (int64_t d = 0; d < dim; ++d) EXPECT_EQ(out[n * dim + d], table[ids[n] * dim + d]);
}

// Repeated ids are summed in increasing position order onto the existing gradient: the
// result equals the sequential loop exactly.
TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  const int64_t V = 7, dim = 6, n = 40;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 5 + i / 3) % V);
  auto dout = random_vec(n * dim, 2), dtable = random_vec(V * dim, 3);
  auto ref = dtable;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < dim; ++d) ref[ids[i] * dim + d] += dout[i * dim + d];
  embedding_backward(ids.data(), dout.data(), dtable.data(), n, dim);
  EXPECT_EQ(dtable, ref);
}

TEST(Embedding, GradCheck) {
  const int64_t V = 5, dim = 3, n = 8;
  const std::vector<int32_t> ids = {1, 4, 1, 0, 2, 1, 4, 3};
  auto table = random_vec(V * dim, 4), r = random_vec(n * dim, 5);
  std::vector<double> dtable(V * dim, 0.0);
  embedding_backward(ids.data(), r.data(), dtable.data(), n, dim);
  test::expect_grad("dtable", table, dtable, [&] {
    std::vector<double> out(n * dim);
    embedding_forward(ids.data(), table.data(), out.data(), n, dim);
    return test::dot(out, r);
  });
}

TEST(Embedding, BitIdenticalAcrossThreadCounts) {
  const int64_t V = 50, dim = 96, n = 4096;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 7919) % V);
  auto dout = random_vec<float>(n * dim, 6);
  auto run = [&](int threads) {
    std::vector<float> dtable(V * dim, 0.125f);
    test::with_threads(threads, [&] { embedding_backward(ids.data(), dout.data(), dtable.data(), n, dim); });
    return dtable;
  };
  const auto one = run(1);
  EXPECT_TRUE(test::bit_equal(one, run(2)));
  EXPECT_TRUE(test::bit_equal(one, run(3)));
}

}  // namespace
}  // namespace mt::cpu
