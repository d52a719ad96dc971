// Trainer: determinism, save -> resume equals an uninterrupted run, checkpoint integrity.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

using test::PatternSource;

// The shared tiny Llama with dropout, cosine decay to 3e-4 and an evaluation every 4 iterations.
Arguments tiny_args(const std::string& save = "", const std::string& load = "") {
  Arguments a = test::tiny_llama_args(save, load);
  a.model.attention_dropout = 0.1f;
  a.model.hidden_dropout = 0.1f;
  a.lr_decay_style = "cosine";
  a.min_lr = 3e-4;
  a.eval_iters = 1;
  a.eval_interval = 4;
  a.log_interval = 100;
  validate_args(a, 40);
  return a;
}

std::vector<double> train(Arguments a, int64_t iters) {
  Trainer t(a, nullptr);
  t.set_data(std::make_unique<PatternSource>(a.model.seq_length), nullptr);
  std::vector<double> losses;
  for (int64_t i = 0; i < iters; ++i) {
    auto r = t.train_step();
    losses.push_back(r.loss_sum / r.tokens);
  }
  if (!a.save.empty()) t.save();
  return losses;
}

TEST(Trainer, SameSeedGivesBitIdenticalLosses) {
  auto a = train(tiny_args(), 6), b = train(tiny_args(), 6);
  EXPECT_EQ(a, b);
  EXPECT_LT(a.back(), a.front());
}

TEST(Trainer, ResumeEqualsUninterrupted) {
  fs::path dir = fs::temp_directory_path() / ("mt_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto full = train(tiny_args(), 8);
  auto first = train(tiny_args(dir.string()), 4);
  Arguments b = tiny_args("", dir.string());
  Trainer t(b, nullptr);
  t.set_data(std::make_unique<PatternSource>(b.model.seq_length), nullptr);
  // Loading happens in run(); use the checkpoint API directly to resume the same way.
  auto it = checkpoint::latest_iteration(dir.string());
  ASSERT_TRUE(it.has_value());
  EXPECT_EQ(*it, 4);
  Trainer resumed(tiny_args("", dir.string()), nullptr);
  resumed.set_data(std::make_unique<PatternSource>(b.model.seq_length), nullptr);
  resumed.load_for_test();
  std::vector<double> rest;
  for (int i = 0; i < 4; ++i) {
    auto r = resumed.train_step();
    rest.push_back(r.loss_sum / r.tokens);
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[static_cast<size_t>(i)], full[static_cast<size_t>(i)]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rest[static_cast<size_t>(i)], full[static_cast<size_t>(4 + i)]) << i;
  fs::remove_all(dir);
}

TEST(Checkpoint, CorruptFileIsNamedAndPreviousSurvives) {
  fs::path dir = fs::temp_directory_path() / ("mt_corrupt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train(tiny_args(dir.string()), 2);
  // Flip a byte in the middle of the model file.
  fs::path f = fs::path(checkpoint::iteration_dir(dir.string(), 2)) / "model.safetensors";
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
    s.put('\x7f');
  }
  Trainer t(tiny_args("", dir.string()), nullptr);
  try {
    t.load_for_test();
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, OtherModelShapeIsRejectedNamingTheTensor) {
  fs::path dir = fs::temp_directory_path() / ("mt_shape_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train(tiny_args(dir.string()), 1);
  Arguments b = tiny_args("", dir.string());
  b.model.ffn_hidden_size = 48;
  Trainer t(b, nullptr);
  try {
    t.load_for_test();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_fc1"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, TrackerMovesLastAndIncompleteSaveIsIgnored) {
  fs::path dir = fs::temp_directory_path() / ("mt_tracker_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  train(tiny_args(dir.string()), 2);
  // A crashed save leaves only a temporary directory: the tracker still names iteration 2.
  fs::create_directories(dir / "iter_0000004.tmp.999");
  EXPECT_EQ(*checkpoint::latest_iteration(dir.string()), 2);
  // A directory without metadata.json is refused by name.
  fs::create_directories(dir / "iter_0000009");
  { std::ofstream(dir / "latest_checkpointed_iteration.txt") << "9"; }
  EXPECT_THROW(checkpoint::read_state(dir.string(), 9), Error);
  fs::remove_all(dir);
}

TEST(Checkpoint, NoSaveOptimThenLoadNeedsNoLoadOptim) {
  fs::path dir = fs::temp_directory_path() / ("mt_noopt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Arguments a = tiny_args(dir.string());
  a.no_save_optim = true;
  train(a, 1);
  EXPECT_FALSE(fs::exists(fs::path(checkpoint::iteration_dir(dir.string(), 1)) / "optimizer.safetensors"));
  Trainer t(tiny_args("", dir.string()), nullptr);
  EXPECT_THROW(t.load_for_test(), Error);
  Arguments c = tiny_args("", dir.string());
  c.no_load_optim = true;
  Trainer t2(c, nullptr);
  EXPECT_NO_THROW(t2.load_for_test());
  EXPECT_EQ(t2.state().iteration, 1);
  Arguments d = tiny_args("", dir.string());
  d.finetune = true;
  Trainer t3(d, nullptr);
  t3.load_for_test();
  EXPECT_EQ(t3.state().iteration, 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt
