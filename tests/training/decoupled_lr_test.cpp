// --decoupled-lr on a CPU training run: the word embedding and the output layer take the decoupled
// rate, every other parameter the default one; a resumed run continues the same schedule; the
// checkpoint records the flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using test::PatternSource;

// Plain SGD (no momentum, no decay, no clipping) at a constant rate: a step moves each weight by
// exactly -lr * grad, so the two groups' moves show their rates.
Arguments sgd_args(double decoupled_lr) {
  Arguments a = test::tiny_llama_args();
  a.optimizer.type = "sgd";
  a.optimizer.sgd_momentum = 0.0f;
  a.optimizer.weight_decay = 0.0f;
  a.optimizer.lr = 1e-2f;
  a.clip_grad = 0.0;
  a.lr_decay_style = "constant";
  a.lr_warmup_iters = 0;
  if (decoupled_lr >= 0) {
    a.decoupled_lr = decoupled_lr;
    a.given.push_back("--decoupled-lr");
  }
  validate_args(a, 40);
  return a;
}

// Each parameter's move over one step from the shared initial weights.
std::map<std::string, std::vector<float>> first_step_moves(const Arguments& a) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  std::map<std::string, std::vector<float>> before;
  for (auto& p : t.model().params().params()) before[p.name] = p.main.to_vector();
  t.train_step();
  std::map<std::string, std::vector<float>> moves;
  for (auto& p : t.model().params().params()) {
    std::vector<float> now = p.main.to_vector(), d(now.size());
    for (size_t i = 0; i < now.size(); ++i) d[i] = now[i] - before[p.name][i];
    moves[p.name] = d;
  }
  return moves;
}

TEST(DecoupledLr, EmbeddingAndOutputMoveAtTheDecoupledRate) {
  const auto base = first_step_moves(sgd_args(-1)), fast = first_step_moves(sgd_args(3e-2));
  ASSERT_EQ(base.size(), fast.size());
  int decoupled = 0;
  for (const auto& [name, d0] : base) {
    const auto& d1 = fast.at(name);
    const bool group = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    decoupled += group;
    double moved = 0;
    for (size_t i = 0; i < d0.size(); ++i) {
      moved += std::abs(d0[i]);
      if (group) {  // 3x the move, up to the rounding of w + move in fp32
        EXPECT_NEAR(d1[i], 3.0 * d0[i], 1e-7 + 1e-4 * std::abs(d0[i])) << name << " [" << i << "]";
      } else {
        ASSERT_EQ(d1[i], d0[i]) << name << " [" << i << "]";
      }
    }
    if (group) {
      EXPECT_GT(moved, 0.0) << name << " did not move";
    }
  }
  EXPECT_EQ(decoupled, 2);
}

// Adam with warm-up and cosine decay to separate floors, saved at 4 and resumed: the same losses
// as 8 uninterrupted iterations, and the checkpoint's arguments carry the flags.
Arguments adam_args(const std::string& save = "", const std::string& load = "") {
  Arguments a = test::tiny_llama_args(save, load);
  a.lr_decay_style = "cosine";
  a.min_lr = 1e-4;
  a.decoupled_lr = 2e-2;
  a.decoupled_min_lr = 2e-3;
  a.given.insert(a.given.end(), {"--decoupled-lr", "--decoupled-min-lr"});
  validate_args(a, 40);
  return a;
}

std::vector<double> losses(Trainer& t, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    auto r = t.train_step();
    out.push_back(r.loss_sum / r.tokens);
  }
  return out;
}

TEST(DecoupledLr, ResumeContinuesTheSchedule) {
  const fs::path dir = fs::temp_directory_path() / ("mt_decoupled_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Trainer full(adam_args(), nullptr);
  full.set_data(std::make_unique<PatternSource>(16), nullptr);
  const auto all = losses(full, 8);
  {
    Trainer first(adam_args(dir.string()), nullptr);
    first.set_data(std::make_unique<PatternSource>(16), nullptr);
    losses(first, 4);
    first.save();
    first.wait_for_saves();
  }
  Trainer resumed(adam_args("", dir.string()), nullptr);
  resumed.set_data(std::make_unique<PatternSource>(16), nullptr);
  resumed.load_for_test();
  const auto rest = losses(resumed, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rest[static_cast<size_t>(i)], all[static_cast<size_t>(4 + i)]) << i;
  // A different rate would have changed the losses: the decoupled group is in effect.
  Arguments plain = adam_args();
  plain.decoupled_lr = plain.decoupled_min_lr = -1;
  Trainer other(plain, nullptr);
  other.set_data(std::make_unique<PatternSource>(16), nullptr);
  EXPECT_NE(losses(other, 8).back(), all.back());

  std::ifstream f(fs::path(checkpoint::iteration_dir(dir.string(), 4)) / "state.json");
  const auto st = nlohmann::json::parse(f);
  const auto& run = st.at("args").at("run_args").at("arguments");
  EXPECT_DOUBLE_EQ(run.at("decoupled_lr").get<double>(), 2e-2) << run.dump();
  EXPECT_DOUBLE_EQ(run.at("decoupled_min_lr").get<double>(), 2e-3);
  fs::remove_all(dir);
}

TEST(DecoupledLr, FlagRulesNameTheFlag) {
  EXPECT_NE(test::pretrain_args_error({"--decoupled-min-lr", "1e-4"}).find("--decoupled-min-lr needs --decoupled-lr"),
            std::string::npos);
  EXPECT_NE(test::pretrain_args_error({"--decoupled-lr", "-1"}).find("--decoupled-lr must be >= 0"), std::string::npos);
  EXPECT_NE(test::pretrain_args_error({"--decoupled-lr", "1e-4", "--decoupled-min-lr", "1e-3"}).find("--decoupled-min-lr"),
            std::string::npos);
  EXPECT_EQ(test::pretrain_args_error({"--decoupled-lr", "1e-3", "--decoupled-min-lr", "1e-4"}), "");
}

}  // namespace
}  // namespace mt
