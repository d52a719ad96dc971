// --moe-use-upcycling: an MoE model made from a dense checkpoint starts where the dense model was
// (softmax top-k routing, granularity 1: the experts are the dense MLP and their weights sum to
// one), and with granularity 2 each expert holds its scaled half of the dense MLP.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_args.h"
#include "checkpoint/upcycle.h"
#include "core/error.h"
#include "model/gpt_model.h"
#include "support/tiny_models.h"

namespace mt {
namespace {

model::TransformerConfig dense_cfg() {
  model::TransformerConfig c = test::tiny_llama_config(2);
  c.attention_dropout = c.hidden_dropout = 0.f;
  c.init_method_std = 0.2f;
  return c;
}

double loss_of(model::GPTModel& m, const model::Batch& b) {
  model::PassContext ctx;
  ctx.training = false;
  model::GPTModel::Saved s;
  const auto r = m.forward(b, s, ctx);
  return r.loss_sum / r.tokens;
}

std::string save_dense(model::GPTModel& dense, const char* name) {
  const auto dir = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove_all(dir);
  checkpoint::TrainingState st;
  data::TokenizerOptions tok;
  tok.type = "NullTokenizer";
  tok.vocab_size = dense.config().orig_vocab_size;
  st.args = checkpoint::model_args_to_json(dense.config(), tok);
  checkpoint::save_checkpoint(dir, st, dense.params(), nullptr);
  return dir;
}

// A 4-expert top-2 MoE config of the dense model with experts of ffn / granularity.
model::TransformerConfig moe_cfg(int64_t experts, int64_t topk, int64_t granularity) {
  model::TransformerConfig c = dense_cfg();
  c.moe.num_experts = experts;
  c.moe.topk = topk;
  c.moe.moe_ffn_hidden_size = c.ffn_hidden_size / granularity;
  return c;
}

TEST(Upcycling, GranularityOneStartsAtTheDenseLoss) {
  model::GPTModel dense(dense_cfg());
  const std::string dir = save_dense(dense, "mt_upcycle_g1");
  model::TransformerConfig c = moe_cfg(4, 2, 1);
  c.moe.layer_pattern = {true, true};
  model::GPTModel moe(c);
  checkpoint::CheckpointReader reader(dir, *checkpoint::latest_iteration(dir));
  checkpoint::upcycle_from_dense(reader, moe.params(), c, dir);
  const model::Batch b = test::random_batch(2, c.seq_length, c.orig_vocab_size, 4);
  EXPECT_NEAR(loss_of(moe, b), loss_of(dense, b), 1e-5);
  std::filesystem::remove_all(dir);
}

TEST(Upcycling, GranularityTwoSplitsAndScalesTheDenseMlp) {
  model::GPTModel dense(dense_cfg());
  const std::string dir = save_dense(dense, "mt_upcycle_g2");
  model::TransformerConfig c = moe_cfg(4, 2, 2);
  model::GPTModel moe(c);
  checkpoint::CheckpointReader reader(dir, *checkpoint::latest_iteration(dir));
  const std::vector<float> router_before = moe.params().find("decoder.layers.0.mlp.router.weight")->main.to_vector();
  checkpoint::upcycle_from_dense(reader, moe.params(), c, dir);
  const double s = checkpoint::upcycling_weight_scale(c, 2);
  EXPECT_NEAR(s, std::pow(2.0, 1.0 / 3.0), 1e-12);
  const int64_t F = c.ffn_hidden_size, h = c.hidden_size, f = F / 2;
  const std::vector<float> d1 = reader.read("decoder.layers.0.mlp.linear_fc1.weight");  // [2F, h]: [gate; up]
  const std::vector<float> d2 = reader.read("decoder.layers.0.mlp.linear_fc2.weight");  // [h, F]
  for (int64_t e = 0; e < 4; ++e) {
    const std::string p = "decoder.layers.0.mlp.experts.local_experts." + std::to_string(e);
    const auto w1 = moe.params().find(p + ".linear_fc1.weight")->main.to_vector();  // [2f, h]
    const auto w2 = moe.params().find(p + ".linear_fc2.weight")->main.to_vector();  // [h, f]
    const int64_t part = e % 2;
    EXPECT_NEAR(w1[0], d1[(part * f) * h] * s, 1e-6) << e;                   // gate row 0 of the part
    EXPECT_NEAR(w1[f * h + 3], d1[(F + part * f) * h + 3] * s, 1e-6) << e;  // up row 0 of the part
    EXPECT_NEAR(w2[1 * f + 2], d2[1 * F + part * f + 2] * s, 1e-6) << e;
  }
  // Router: its own rows 0 and 1, each twice.
  const auto r = moe.params().find("decoder.layers.0.mlp.router.weight")->main.to_vector();
  for (int64_t j = 0; j < h; ++j) {
    EXPECT_EQ(r[0 * h + j], router_before[0 * h + j]);
    EXPECT_EQ(r[1 * h + j], router_before[0 * h + j]);
    EXPECT_EQ(r[2 * h + j], router_before[1 * h + j]);
    EXPECT_EQ(r[3 * h + j], router_before[1 * h + j]);
  }
  std::filesystem::remove_all(dir);
}

TEST(Upcycling, RefusesACheckpointOfAnotherShape) {
  model::TransformerConfig other = dense_cfg();
  other.hidden_size = 32;
  model::GPTModel dense(other);
  const std::string dir = save_dense(dense, "mt_upcycle_bad");
  model::TransformerConfig c = moe_cfg(2, 1, 1);
  model::GPTModel moe(c);
  checkpoint::CheckpointReader reader(dir, *checkpoint::latest_iteration(dir));
  try {
    checkpoint::upcycle_from_dense(reader, moe.params(), c, dir);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--moe-use-upcycling"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mt
