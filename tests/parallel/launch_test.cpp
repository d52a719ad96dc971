// `megatron launch` and `megatron pretrain` as processes: a launched run trains and exits 0; a
// rank that dies makes the launcher stop the others and name the rank; without the launcher,
// the surviving rank names the dead one and exits well inside --distributed-timeout-minutes.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/socket.h"
#include "comm/store.h"

extern char** environ;

namespace mt {
namespace {

const std::string kBin = std::string(MT_BINARY_DIR) + "/bin/megatron";

std::vector<std::string> pretrain_args(int iters) {
  return {"pretrain", "--mock-data", "--vocab-size", "60", "--num-layers", "1", "--hidden-size", "16",
          "--num-attention-heads", "2", "--seq-length", "8", "--micro-batch-size", "1", "--global-batch-size", "2",
          "--train-iters", std::to_string(iters), "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0",
          "--make-vocab-size-divisible-by", "16", "--no-progress-bar", "--distributed-timeout-minutes", "5"};
}

struct Proc {
  pid_t pid = -1;
  std::string out;  // file with stdout+stderr
};

Proc spawn(const std::vector<std::string>& args, const std::vector<std::string>& env_extra, const std::string& out) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("OMP_NUM_THREADS=1");
  for (auto& e : env_extra) env.push_back(e);
  std::vector<char*> argv, envp;
  argv.push_back(const_cast<char*>(kBin.c_str()));
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  Proc p;
  p.out = out;
  EXPECT_EQ(posix_spawn(&p.pid, kBin.c_str(), &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  return p;
}

// Waits up to `secs`; returns the wait status, or -1 (after killing it) on timeout.
int wait_for(const Proc& p, double secs) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    int st = 0;
    if (::waitpid(p.pid, &st, WNOHANG) == p.pid) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(p.pid, SIGKILL);
  int st = 0;
  ::waitpid(p.pid, &st, 0);
  return -1;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int free_port() {
  int port = 0;
  int fd = comm::listen_on("127.0.0.1", 0, &port);
  ::close(fd);
  return port;
}

std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  for (pid_t c; f >> c;) out.push_back(c);
  return out;
}

// Waits until `path` contains `what` (the run reached that point) or the time is up.
bool wait_for_text(const std::string& path, const std::string& what, double secs) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs) {
    if (slurp(path).find(what) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(Launch, TwoRanksTrainAndExitZero) {
  std::string out = "/tmp/mt_launch_ok_" + std::to_string(::getpid());
  auto args = std::vector<std::string>{"launch", "--nproc-per-node", "2", "--master-port", std::to_string(free_port()),
                                       "--"};
  for (auto& a : pretrain_args(3)) args.push_back(a);
  Proc p = spawn(args, {}, out);
  int st = wait_for(p, 120);
  std::string text = slurp(out);
  ASSERT_TRUE(st != -1 && WIFEXITED(st)) << text;
  EXPECT_EQ(WEXITSTATUS(st), 0) << text;
  EXPECT_NE(text.find("distributed: 2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("iteration        3/       3"), std::string::npos) << text;
  std::remove(out.c_str());
}

TEST(Launch, KilledRankStopsTheOthersAndIsNamed) {
  std::string out = "/tmp/mt_launch_kill_" + std::to_string(::getpid());
  auto args = std::vector<std::string>{"launch", "--nproc-per-node", "3", "--master-port", std::to_string(free_port()),
                                       "--"};
  for (auto& a : pretrain_args(1000000)) args.push_back(a);
  args.push_back("--global-batch-size");
  args.push_back("3");
  Proc p = spawn(args, {}, out);
  ASSERT_TRUE(wait_for_text(out, "iteration", 60)) << slurp(out);
  auto kids = children_of(p.pid);
  ASSERT_EQ(kids.size(), 3u);
  ::kill(kids[1], SIGKILL);
  int st = wait_for(p, 30);
  std::string text = slurp(out);
  ASSERT_NE(st, -1) << "launcher did not stop: " << text;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << text;
  EXPECT_NE(text.find("rank 1 (local rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("killed by signal 9"), std::string::npos) << text;
  EXPECT_TRUE(children_of(p.pid).empty());
  std::remove(out.c_str());
}

TEST(Launch, WithoutLauncherTheSurvivorNamesTheDeadRank) {
  const std::string port = std::to_string(free_port());
  std::string out0 = "/tmp/mt_pair0_" + std::to_string(::getpid()), out1 = "/tmp/mt_pair1_" + std::to_string(::getpid());
  auto args = pretrain_args(1000000);
  const std::string secret = "MT_STORE_SECRET=" + comm::random_store_secret();
  Proc r0 = spawn(args, {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + port, secret}, out0);
  Proc r1 = spawn(args, {"RANK=1", "WORLD_SIZE=2", "MASTER_PORT=" + port, secret}, out1);
  ASSERT_TRUE(wait_for_text(out0, "iteration", 60)) << slurp(out0) << slurp(out1);
  auto t0 = std::chrono::steady_clock::now();
  ::kill(r1.pid, SIGKILL);
  int st1 = 0;
  ::waitpid(r1.pid, &st1, 0);
  int st0 = wait_for(r0, 30);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string text = slurp(out0);
  ASSERT_NE(st0, -1) << "rank 0 hung: " << text;
  EXPECT_TRUE(WIFEXITED(st0) && WEXITSTATUS(st0) == 2) << text;
  EXPECT_NE(text.find("world rank 1 exited or crashed"), std::string::npos) << text;
  EXPECT_LT(secs, 20.0);  // far inside the 5-minute timeout
  std::remove(out0.c_str());
  std::remove(out1.c_str());
}

TEST(Launch, BadUsageIsExplained) {
  std::string out = "/tmp/mt_launch_bad_" + std::to_string(::getpid());
  Proc p = spawn({"launch", "--nproc-per-node", "2"}, {}, out);
  int st = wait_for(p, 30);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 2);
  EXPECT_NE(slurp(out).find("put the command after '--'"), std::string::npos) << slurp(out);
  std::remove(out.c_str());
}

}  // namespace
}  // namespace mt
