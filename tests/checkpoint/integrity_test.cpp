// Checkpoint integrity and saving: async saves snapshot the state they were asked for, a kill -9
// in the middle of a save leaves the previous checkpoint the latest and loadable, damaged or
// missing shards are named, --save-retain-interval keeps what Megatron keeps, and the format
// flags say what is supported.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_args.h"
#include "core/error.h"
#include "kernels/cpu/threads.h"
#include "model/gpt_model.h"
#include "support/tiny_training.h"
#include "training/trainer.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

using test::PatternSource;

// The shared tiny Llama as it is (linear decay, no evaluation).
Arguments tiny(const std::string& save = "", const std::string& load = "") {
  Arguments a = test::tiny_llama_args(save, load);
  validate_args(a, 40);
  return a;
}

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("mt_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

double step(Trainer& t) {
  auto r = t.train_step();
  return r.loss_sum / r.tokens;
}

TEST(AsyncSave, SnapshotsTheStateItWasAskedForWhileTrainingGoesOn) {
  const fs::path dir = fresh("async");
  std::vector<double> full;
  {
    Trainer t(tiny(), nullptr);
    t.set_data(std::make_unique<PatternSource>(16), nullptr);
    for (int i = 0; i < 6; ++i) full.push_back(step(t));
  }
  Arguments a = tiny(dir.string());
  a.async_save = true;
  {
    Trainer t(a, nullptr);
    t.set_data(std::make_unique<PatternSource>(16), nullptr);
    for (int i = 0; i < 3; ++i) step(t);
    t.save();  // returns at once; the files are written while the next steps change the weights
    for (int i = 0; i < 2; ++i) step(t);
    EXPECT_FALSE(checkpoint::latest_iteration(dir.string()).has_value() &&
                 *checkpoint::latest_iteration(dir.string()) != 3);  // nothing else ever became the latest
    t.wait_for_saves();
  }
  EXPECT_EQ(*checkpoint::latest_iteration(dir.string()), 3);
  Trainer r(tiny("", dir.string()), nullptr);
  r.set_data(std::make_unique<PatternSource>(16), nullptr);
  r.load_for_test();
  for (int i = 3; i < 6; ++i) EXPECT_EQ(step(r), full[static_cast<size_t>(i)]) << i;
  fs::remove_all(dir);
}

TEST(AsyncSave, KillDuringSaveLeavesThePreviousCheckpointLatest) {
  const fs::path dir = fresh("kill");
  const fs::path marker = dir.string() + ".started";
  fs::remove(marker);
  pid_t pid = ::fork();
  if (pid == 0) {
    cpu::set_num_threads(1);  // OpenMP teams do not survive fork(): stay on this thread
    try {
      Arguments a = tiny();
      model::GPTModel m(a.model);
      checkpoint::TrainingState st;
      st.iteration = 1;
      st.args = checkpoint::model_args_to_json(a.model, a.tokenizer);
      checkpoint::save_checkpoint(dir.string(), st, m.params(), nullptr);
      checkpoint::Saver s(checkpoint::RankInfo{});
      checkpoint::SaveOptions o;
      o.async = true;
      o.write_delay_ms = 60000;  // a very slow disk: killed long before the save completes
      st.iteration = 2;
      s.save(dir.string(), st, m.params(), nullptr, o);
      std::ofstream(marker) << "x";
      std::this_thread::sleep_for(std::chrono::seconds(120));
    } catch (...) {
    }
    ::_exit(3);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path part = fs::path(checkpoint::iteration_dir(dir.string(), 2) + ".tmp") / "model.safetensors";
  while (!(fs::exists(marker) && fs::exists(part)) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(fs::exists(part)) << "the save never started writing";
  EXPECT_EQ(*checkpoint::latest_iteration(dir.string()), 1);
  EXPECT_FALSE(fs::exists(checkpoint::iteration_dir(dir.string(), 2)));
  Arguments a = tiny();
  model::GPTModel m(a.model);
  checkpoint::LoadOptions lo;
  lo.load_optim = false;
  EXPECT_EQ(checkpoint::load_checkpoint(dir.string(), 1, m.params(), nullptr, lo).iteration, 1);
  // The next save of that iteration replaces the leftover directory.
  checkpoint::TrainingState st;
  st.iteration = 2;
  st.args = checkpoint::model_args_to_json(a.model, a.tokenizer);
  checkpoint::save_checkpoint(dir.string(), st, m.params(), nullptr);
  EXPECT_EQ(*checkpoint::latest_iteration(dir.string()), 2);
  EXPECT_FALSE(fs::exists(checkpoint::iteration_dir(dir.string(), 2) + ".tmp"));
  fs::remove_all(dir);
  fs::remove(marker);
}

TEST(Integrity, CorruptOrMissingShardIsNamed) {
  const fs::path dir = fresh("corrupt");
  {
    Trainer t(tiny(dir.string()), nullptr);
    t.set_data(std::make_unique<PatternSource>(16), nullptr);
    step(t);
    t.save();
  }
  const fs::path it = checkpoint::iteration_dir(dir.string(), 1);
  const fs::path opt = it / "optimizer.safetensors";
  {
    std::fstream s(opt, std::ios::in | std::ios::out | std::ios::binary);
    s.seekp(static_cast<std::streamoff>(fs::file_size(opt) - 10));
    s.put('\x55');
  }
  try {
    Trainer t(tiny("", dir.string()), nullptr);
    t.load_for_test();
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos) << e.what();
  }
  // --no-load-optim never reads that file.
  Arguments b = tiny("", dir.string());
  b.no_load_optim = true;
  Trainer ok(b, nullptr);
  EXPECT_NO_THROW(ok.load_for_test());
  fs::remove(opt);
  try {
    Trainer t(tiny("", dir.string()), nullptr);
    t.load_for_test();
    FAIL() << "missing shard not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.safetensors' is missing"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Integrity, SaveRetainIntervalKeepsMultiplesAndTheLatest) {
  const fs::path dir = fresh("retain");
  Arguments a = tiny();
  model::GPTModel m(a.model);
  checkpoint::Saver s(checkpoint::RankInfo{});
  checkpoint::SaveOptions o;
  o.retain_interval = 3;
  for (int64_t i = 1; i <= 7; ++i) {
    checkpoint::TrainingState st;
    st.iteration = i;
    st.args = checkpoint::model_args_to_json(a.model, a.tokenizer);
    s.save(dir.string(), st, m.params(), nullptr, o);
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory()) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"iter_0000003", "iter_0000006", "iter_0000007"}));
  fs::remove_all(dir);
}

TEST(Integrity, CheckpointFormatFlags) {
  auto err = [](std::vector<std::string> argv) {
    try {
      parse_pretrain_args(argv);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err({"--ckpt-format", "native", "--auto-detect-ckpt-format", "--async-save", "--save-retain-interval", "5"}),
            "");
  // Megatron-LM's formats parse (torch with --save is refused later, by validate_args: cli.bad_input_megatron_ckpt).
  EXPECT_EQ(err({"--ckpt-format", "torch_dist", "--save", "x"}), "");
  EXPECT_EQ(err({"--ckpt-format", "torch"}), "");
  EXPECT_NE(err({"--ckpt-format", "zarr"}).find("--ckpt-format zarr"), std::string::npos);
  // A Megatron-LM torch_dist directory reads like a native one; its iteration directory is named.
  const fs::path dir = fresh("torchdist");
  fs::create_directories(dir / "iter_0000010");
  std::ofstream(dir / "iter_0000010" / ".metadata") << "x";
  std::ofstream(dir / "latest_checkpointed_iteration.txt") << "10";
  EXPECT_EQ(checkpoint::detect_checkpoint(dir.string()), checkpoint::CheckpointKind::Native);
  try {
    checkpoint::detect_checkpoint((dir / "iter_0000010").string());
    FAIL();
  } catch (const Error& x) {
    EXPECT_NE(std::string(x.what()).find("torch_dist"), std::string::npos) << x.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt
