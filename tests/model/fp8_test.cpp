// FP8 linears' bookkeeping (model/fp8.h): the operands' quantization per recipe and the health
// the log line reports.
#include "model/fp8.h"

#include <gtest/gtest.h>

#include <vector>

#include "kernels/ops.h"

namespace mt::model {
namespace {

Tensor vec(std::vector<float> v, Shape s) { return Tensor::from_vector(v, s); }

Fp8Config delayed(int64_t history) {
  Fp8Config c;
  c.enabled = true;
  c.hybrid = true;
  c.amax_history_len = history;
  return c;
}

TEST(Fp8Linear, DelayedForwardUsesTheOldScaleAndBackwardReadsTheInputAsTheForwardDid) {
  Fp8Store store(delayed(1));
  Fp8Linear lin = make_fp8_linear(store, "decoder.layers.0.mlp.linear_fc1.weight", nullptr);
  EXPECT_EQ(lin.state->name, "decoder.layers.0.mlp.linear_fc1");
  PassContext ctx;
  const Tensor x = vec({1000.f, 1.f}, {1, 2});
  // The first forward quantizes with scale 1 (1000 saturates to 448), then the scale becomes 448/1000.
  EXPECT_EQ(lin.forward_input(x, ctx).to_vector(), (std::vector<float>{448.f, 1.f}));
  EXPECT_FLOAT_EQ(lin.state->input.scale.to_vector()[0], 0.448f);
  // A second forward (next micro-batch) uses the new scale; its backward pops the first's scale.
  const std::vector<float> second = lin.forward_input(x, ctx).to_vector();
  EXPECT_NEAR(second[0], 1000.f, 1e-3f);
  const Fp8Linear::Backward b = lin.backward_operands(vec({2.f, 3.f}, {1, 2}), x);
  EXPECT_EQ(b.x_wgrad.to_vector(), (std::vector<float>{448.f, 1.f}));  // as the first forward read it
  EXPECT_EQ(b.dy_dgrad.to_vector(), (std::vector<float>{2.f, 3.f}));   // E5M2 at scale 1: exact
  EXPECT_EQ(lin.state->pending_input_scales.size(), 1u);
  // Health: one element clipped in the first forward; scales 0.448 (input), 1 (weight), 57344/3 (grad).
  const Fp8Health h = take_fp8_health(store);
  EXPECT_EQ(h.saturated, 1);
  EXPECT_TRUE(h.has_scales);
  EXPECT_FLOAT_EQ(h.min_scale, 0.448f);
  EXPECT_FLOAT_EQ(h.max_scale, 57344.f / 3.f);
  EXPECT_EQ(take_fp8_health(store).saturated, 0);  // counted once
}

TEST(Fp8Linear, WeightIsQuantizedOncePerStepAndEvaluationChangesNothing) {
  Fp8Store store(delayed(2));
  Fp8Linear lin = make_fp8_linear(store, "w.weight", nullptr);
  PassContext train, eval;
  eval.training = false;
  const Tensor w = vec({4.f, -2.f}, {1, 2});
  lin.forward_weight(w, eval);
  EXPECT_EQ(lin.state->weight.scale.to_vector()[0], 1.f);  // evaluation leaves the state alone
  lin.forward_weight(w, train);
  lin.forward_weight(w, train);  // the same step: the cached weight, no second update
  EXPECT_EQ(lin.state->weight.scale.to_vector()[0], 112.f);
  EXPECT_EQ(lin.state->weight.history.to_vector(), (std::vector<float>{0.f, 4.f}));
  store.weights_changed();
  lin.forward_weight(vec({8.f, 0.f}, {1, 2}), train);
  EXPECT_EQ(lin.state->weight.scale.to_vector()[0], 56.f);
}

TEST(Fp8Linear, RecomputationReplaysTheFirstForwardsScale) {
  Fp8Store store(delayed(1));
  Fp8Linear lin = make_fp8_linear(store, "w.weight", nullptr);
  PassContext ctx, re;
  re.recomputing = true;
  const Tensor x = vec({1000.f}, {1, 1});
  lin.forward_input(x, ctx);  // scale 1 used; the state moves to 0.448
  EXPECT_EQ(lin.forward_input(x, re).to_vector(), (std::vector<float>{448.f}));  // the first forward's scale
  EXPECT_FLOAT_EQ(lin.state->input.scale.to_vector()[0], 0.448f);              // not updated again
  EXPECT_EQ(lin.state->pending_input_scales.size(), 1u);
}

TEST(Fp8Linear, BlockwiseTilesRunAlongEachGemmsReduction) {
  Fp8Config c = delayed(1);
  c.recipe = Fp8Recipe::Blockwise;
  c.hybrid = false;  // E4M3 gradients: a tile scaled for 400 flushes 1e-4 to zero
  Fp8Store store(c);
  Fp8Linear lin = make_fp8_linear(store, "w.weight", nullptr);
  // dy [2, 2]: the data gradient reduces over dy's columns (row tiles: 1e-4 has its own), the
  // weight gradient over its rows (column tiles: 1e-4 shares one with 400 and becomes 0).
  const Tensor dy = vec({400.f, 0.f, 1e-4f, 0.f}, {2, 2});
  const Fp8Linear::Backward b = lin.backward_operands(dy, vec({1.f, 1.f, 1.f, 1.f}, {2, 2}));
  EXPECT_NEAR(b.dy_dgrad.to_vector()[2], 1e-4f, 1e-5f);
  EXPECT_EQ(b.dy_wgrad.to_vector()[2], 0.f);
  EXPECT_EQ(b.dy_wgrad.to_vector()[0], 384.f);  // scale 1: 400 ties between 384 and 416
  EXPECT_EQ(take_fp8_health(store).has_scales, false);
}

}  // namespace
}  // namespace mt::model
