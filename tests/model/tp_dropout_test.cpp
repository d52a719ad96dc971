// Megatron's model-parallel RNG: dropout inside tensor-parallel regions (attention
// probabilities on a rank's own heads; the hidden dropouts on a rank's own sequence rows under
// --sequence-parallel) draws from a per-TP-rank stream, so two TP ranks use different masks
// there; hidden dropout on replicated activations (TP without SP) must use the same mask on
// every TP rank, or the replicas drift apart. Two ranks are simulated with the streams the
// trainer gives them: a shared dropout stream and tp stream seed + 2718 + tp rank.
#include <gtest/gtest.h>

#include <vector>

#include "model/layers.h"

namespace mt::model {
namespace {

struct RankStreams {
  RngState shared, tp;
  PassContext ctx;
  explicit RankStreams(int tp_rank) : shared{1234, 0}, tp{1234 + 2718 + static_cast<uint64_t>(tp_rank), 0} {
    ctx.rng = &shared;
    ctx.tp_rng = &tp;
  }
};

std::vector<float> mask_of(const Dropout& d, PassContext& ctx) {
  Tensor x = Tensor::empty({64, 32});
  x.fill_(1.f);
  Dropout::Saved s;
  Tensor y = d.forward(x, s, ctx);
  const float* p = y.data<float>();
  return std::vector<float>(p, p + y.numel());
}

TEST(TpDropout, ReplicatedActivationsShareTheMaskAcrossTpRanks) {
  Dropout d;
  d.p = 0.3f;
  d.tp_region = false;  // hidden dropout with TP and no SP: every TP rank holds the same rows
  RankStreams r0(0), r1(1);
  const auto m0 = mask_of(d, r0.ctx), m1 = mask_of(d, r1.ctx);
  EXPECT_EQ(m0, m1);
  EXPECT_EQ(r0.tp.offset, 0u);  // the per-rank stream is untouched
  EXPECT_GT(r0.shared.offset, 0u);
}

TEST(TpDropout, TensorParallelRegionsDrawPerRankMasks) {
  Dropout d;
  d.p = 0.3f;
  d.tp_region = true;  // SP shards or a rank's own heads
  RankStreams r0(0), r1(1);
  const auto m0 = mask_of(d, r0.ctx), m1 = mask_of(d, r1.ctx);
  EXPECT_NE(m0, m1);
  EXPECT_EQ(r0.shared.offset, 0u);  // the shared stream stays in step across ranks
  // Each mask still drops about p of the elements.
  for (const auto* m : {&m0, &m1}) {
    size_t zeros = 0;
    for (float v : *m) zeros += v == 0.f;
    EXPECT_NEAR(static_cast<double>(zeros) / static_cast<double>(m->size()), 0.3, 0.05);
  }
}

TEST(TpDropout, WithoutTensorParallelEveryDropoutUsesTheSharedStream) {
  Dropout d;
  d.p = 0.3f;
  d.tp_region = true;
  RngState shared{1234, 0};
  PassContext ctx;
  ctx.rng = &shared;  // TP = 1: the trainer sets no tp stream
  (void)mask_of(d, ctx);
  EXPECT_GT(shared.offset, 0u);
}

}  // namespace
}  // namespace mt::model
