// The CPU versions of the ops that used to live outside kernels/: the loss head's bookkeeping,
// the gradient norm over ranges, and vocab-parallel cross-entropy with its ShardReduce (two
// shards computed in two threads whose reduce combines their statistics, as the model's
// tensor-parallel all-reduce does).
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace mt::ops {
namespace {

std::vector<float> values(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

TEST(HostLossHead, UploadScaledMaskAndMaskedSum) {
  const std::vector<float> mask = {1.f, 0.f, 1.f, 1.f};
  const Tensor m = upload(mask.data(), {4}, DType::F32, Device::CPU);
  ASSERT_EQ(m.device(), Device::CPU);
  EXPECT_EQ(values(m), mask);
  EXPECT_EQ(values(scaled_mask(m, 0.25f)), (std::vector<float>{0.25f, 0.f, 0.25f, 0.25f}));

  const std::vector<float> losses = {2.f, 100.f, 0.5f, 1.5f};
  const Tensor l = upload(losses.data(), {4}, DType::F32, Device::CPU);
  Tensor acc = Tensor::zeros({1}, DType::I64);
  accumulate_masked_loss(l, m, acc);
  accumulate_masked_loss(l, m, acc);  // adds: the sum of two micro-batches
  double sum = 0;
  std::memcpy(&sum, acc.raw(), sizeof sum);
  EXPECT_EQ(sum, 8.0);
}

TEST(HostGradNorm, SumsTheRangesInTheGivenOrder) {
  const auto g = test::random_vec<float>(300, 1);
  const Tensor t = upload(g.data(), {300}, DType::F32, Device::CPU);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{200, 300}, {0, 50}, {50, 50}};
  const double want = cpu::sum_squares(g.data() + 200, 100) + cpu::sum_squares(g.data(), 50);
  EXPECT_EQ(grad_norm_squared(t, ranges), want);
  EXPECT_EQ(grad_norm_squared(t, {}), 0.0);
}

// Two vocabulary shards in two threads; the reduce meets at a barrier and combines both
// buffers in place, in rank order.
class TwoShards {
 public:
  ShardReduce reduce_for(int rank) {
    return [this, rank](void* data, size_t count, ReduceType type, ReduceOp op) {
      bufs_[rank] = data;
      sync_.arrive_and_wait();
      if (rank == 0) {
        if (type == ReduceType::F32)
          combine(static_cast<float*>(bufs_[0]), static_cast<float*>(bufs_[1]), count, op);
        else
          combine(static_cast<double*>(bufs_[0]), static_cast<double*>(bufs_[1]), count, op);
      }
      sync_.arrive_and_wait();
    };
  }

 private:
  template <typename T>
  static void combine(T* a, T* b, size_t n, ReduceOp op) {
    for (size_t i = 0; i < n; ++i) a[i] = b[i] = op == ReduceOp::Max ? std::max(a[i], b[i]) : a[i] + b[i];
  }
  std::barrier<> sync_{2};
  void* bufs_[2] = {};
};

TEST(HostVocabParallel, CrossEntropyOverTwoShardsIsTheFullOne) {
  const int64_t n = 6, V = 16, vl = V / 2;
  const auto x = test::random_vec<float>(n * V, 2, -4, 4);
  const std::vector<int32_t> lab = {0, 7, 8, 15, 3, 12};
  const std::vector<float> ones(n, 1.f);
  const Tensor labels = upload(lab.data(), {n}, DType::I32, Device::CPU);
  const Tensor dloss = upload(ones.data(), {n}, DType::F32, Device::CPU);
  const Tensor logits = upload(x.data(), {n, V}, DType::F32, Device::CPU);
  Tensor want_loss, want_lse;
  cross_entropy_forward(logits, labels, want_loss, want_lse);
  const Tensor want_grad = cross_entropy_backward(logits, labels, want_lse, dloss);

  TwoShards shards;
  Tensor loss[2], lse[2], grad[2];
  auto rank = [&](int r) {
    std::vector<float> cols(n * vl);
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.data() + i * V + r * vl, vl, cols.data() + i * vl);
    const Tensor part = upload(cols.data(), {n, vl}, DType::F32, Device::CPU);
    vocab_cross_entropy_forward(part, labels, r * vl, shards.reduce_for(r), loss[r], lse[r]);
    grad[r] = vocab_cross_entropy_backward(part, labels, lse[r], dloss, r * vl);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(values(loss[r]), values(loss[0])) << "every rank has the same losses";
    EXPECT_LT(test::max_abs_diff(values(loss[r]), values(want_loss)), 1e-5);
    EXPECT_LT(test::max_abs_diff(values(lse[r]), values(want_lse)), 1e-5);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < vl; ++j)
        EXPECT_NEAR(grad[r].data<float>()[i * vl + j], want_grad.data<float>()[i * V + r * vl + j], 1e-6);
  }
}

TEST(HostVocabParallel, EmbeddingRowsOfTheShardOnly) {
  const int64_t vl = 3, h = 2, start = 3;
  const std::vector<float> table = {1, 2, 3, 4, 5, 6};  // ids 3, 4, 5
  const std::vector<int32_t> ids = {0, 4, 5, 4, 6};
  const Tensor t = upload(table.data(), {vl, h}, DType::F32, Device::CPU);
  const Tensor id = upload(ids.data(), {5}, DType::I32, Device::CPU);
  EXPECT_EQ(values(vocab_embedding_forward(id, t, start)), (std::vector<float>{0, 0, 3, 4, 5, 6, 3, 4, 0, 0}));
  const std::vector<float> dout = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  Tensor dtable = Tensor::zeros({vl, h});
  vocab_embedding_backward(id, upload(dout.data(), {5, h}, DType::F32, Device::CPU), dtable, start);
  EXPECT_EQ(values(dtable), (std::vector<float>{0, 0, 6, 6, 3, 3}));
}

}  // namespace
}  // namespace mt::ops
