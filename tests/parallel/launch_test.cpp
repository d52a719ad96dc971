// `megatron launch` and `megatron pretrain` as processes: a launched run trains and exits 0; a
// rank that dies makes the launcher stop the others and name the rank; without the launcher,
// the surviving rank names the dead one and exits well inside --distributed-timeout-minutes.
// The launcher's store is private (loopback only for one node, secret required) and survives a
// client that stops reading; a signal while ranks are starting stops the ones started.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/socket.h"
#include "comm/store.h"
#include "comm/store_peers.h"

extern char** environ;

namespace mt {
namespace {

const std::string kBin = std::string(MT_BINARY_DIR) + "/bin/megatron";
// Long enough that a client stalls the store well before the job's end (a few seconds here).
constexpr int kStallJobIters = 300;

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
  std::vector<std::string> extra{"OMP_NUM_THREADS=1"};
  extra.insert(extra.end(), env_extra.begin(), env_extra.end());
  auto name_of = [](const std::string& e) { return e.substr(0, e.find('=')); };
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)  // the extra variables replace inherited ones of the same name
    if (std::none_of(extra.begin(), extra.end(), [&](const std::string& x) { return name_of(x) == name_of(*e); }))
      env.emplace_back(*e);
  for (auto& e : extra) env.push_back(e);
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

// A non-loopback IPv4 address of this machine, or "" if it has none.
std::string non_loopback_ipv4() {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return "";
  std::string out;
  for (ifaddrs* i = ifs; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP))
      continue;
    const auto* sin = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    char buf[INET_ADDRSTRLEN];
    if ((ntohl(sin->sin_addr.s_addr) >> 24) != 127 && inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf))) out = buf;
  }
  ::freeifaddrs(ifs);
  return out;
}

// One connection attempt to ip:port: 0 if it connects, else the errno.
int try_connect(const std::string& ip, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &sa.sin_addr);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

// Processes (of this user) whose environment holds `token`: what a launcher left behind.
int processes_with(const std::string& token) {
  int n = 0;
  DIR* d = ::opendir("/proc");
  for (dirent* e; d && (e = ::readdir(d));) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/environ", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    n += ss.str().find(token) != std::string::npos ? 1 : 0;
  }
  if (d) ::closedir(d);
  return n;
}

// A one-rank job that trains until stopped, and its store port.
struct RunningJob {
  Proc proc;
  int port = 0;
};

RunningJob start_long_job(const std::string& out, const std::vector<std::string>& env = {}) {
  RunningJob job;
  job.port = free_port();
  auto args = std::vector<std::string>{"launch", "--nproc-per-node", "1", "--master-port", std::to_string(job.port), "--"};
  for (auto& a : pretrain_args(1000000)) args.push_back(a);
  job.proc = spawn(args, env, out);
  EXPECT_TRUE(wait_for_text(out, "iteration", 60)) << slurp(out);
  return job;
}

void stop_job(const RunningJob& job) {
  ::kill(job.proc.pid, SIGTERM);
  const int st = wait_for(job.proc, 60);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM) << slurp(job.proc.out);
  std::remove(job.proc.out.c_str());
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
  // The first rank that failed, with its signal and the status a shell reports for it; not
  // rank 0 or 2, which exit with code 2 because rank 1 vanished.
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL) << text;
  EXPECT_NE(text.find("megatron launch: error: rank 1 (local rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << text;
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

TEST(Launch, WithoutLauncherTheSecretIsRequired) {
  std::string out = "/tmp/mt_nosecret_" + std::to_string(::getpid());
  Proc p = spawn(pretrain_args(2), {"RANK=0", "WORLD_SIZE=2", "MASTER_PORT=" + std::to_string(free_port())}, out);
  const int st = wait_for(p, 60);
  EXPECT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 2) << slurp(out);
  EXPECT_NE(slurp(out).find("MT_STORE_SECRET is not set"), std::string::npos) << slurp(out);
  std::remove(out.c_str());
}

TEST(Launch, SingleNodeStoreIsUnreachableFromTheNetwork) {
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  RunningJob job = start_long_job("/tmp/mt_launch_net_" + std::to_string(::getpid()));
  EXPECT_EQ(try_connect("127.0.0.1", job.port), 0) << "the store is not up: the check below would prove nothing";
  EXPECT_EQ(try_connect(ip, job.port), ECONNREFUSED) << "the store answers on " << ip;
  stop_job(job);
}

TEST(Launch, StoreRefusesAClientWithoutTheSecret) {
  RunningJob job = start_long_job("/tmp/mt_launch_secret_" + std::to_string(::getpid()));
  try {
    comm::TcpStore guess("127.0.0.1", job.port, std::chrono::seconds(10), "not-the-jobs-secret-000", -1);
    ADD_FAILURE() << "the launcher's store accepted a wrong secret";
  } catch (const comm::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
  comm::Socket intruder = testing::raw_store_connect(job.port);
  testing::send_bytes(intruder, comm::encode_store_request(comm::kStoreLost, "", ""));
  EXPECT_TRUE(testing::closed_within(intruder, std::chrono::seconds(10)));
  stop_job(job);
}

TEST(Launch, StalledStoreClientCannotFailTheJob) {
  std::string out = "/tmp/mt_launch_stall_" + std::to_string(::getpid());
  const std::string secret = "stalled-client-test-" + std::to_string(::getpid());
  const int port = free_port();
  auto args = std::vector<std::string>{"launch", "--nproc-per-node", "2", "--master-port", std::to_string(port), "--"};
  for (auto& a : pretrain_args(kStallJobIters)) args.push_back(a);
  Proc p = spawn(args, {"MT_STORE_SECRET=" + secret}, out);
  // A client that knows the secret sets an 8 MB value and pipelines GETs without reading the
  // replies: the old single-threaded store blocked writing to it, and every rank with it.
  comm::Socket staller = testing::raw_store_connect(port, std::chrono::seconds(30));
  ASSERT_TRUE(testing::authenticate(staller, secret));
  ASSERT_TRUE(testing::stall_store(staller));
  int st = 0;
  ASSERT_EQ(::waitpid(p.pid, &st, WNOHANG), 0) << "the job ended before the client stalled: raise kStallJobIters";
  st = wait_for(p, 240);
  const std::string text = slurp(out);
  ASSERT_NE(st, -1) << "the job hung: " << text;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << text;
  EXPECT_NE(text.find(fmt::format("iteration {:>8}/{:>8}", kStallJobIters, kStallJobIters)), std::string::npos) << text;
  std::remove(out.c_str());
}

TEST(Launch, SignalWhileStartingRanksStopsTheStartedOnes) {
  std::string out = "/tmp/mt_launch_sigstart_" + std::to_string(::getpid());
  const std::string token = "MT_TEST_LAUNCH_TOKEN=sigstart" + std::to_string(::getpid());
  auto args = std::vector<std::string>{"launch", "--nproc-per-node", "4", "--master-port", std::to_string(free_port()),
                                       "--"};
  for (auto& a : pretrain_args(1000000)) args.push_back(a);
  Proc p = spawn(args, {"MT_LAUNCH_TEST_FORK_DELAY_MS=1000", token}, out);
  const auto t0 = std::chrono::steady_clock::now();
  while (children_of(p.pid).empty() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(children_of(p.pid).empty()) << slurp(out);
  ::kill(p.pid, SIGTERM);
  const int st = wait_for(p, 60);
  const std::string text = slurp(out);
  ASSERT_NE(st, -1) << "the launcher did not stop: " << text;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM) << text;
  EXPECT_NE(text.find("SIGTERM while starting ranks"), std::string::npos) << text;
  // It stopped starting ranks: fewer than 4 were started.
  int started = -1;
  const size_t at = text.find("stopping the ");
  if (at != std::string::npos) std::sscanf(text.c_str() + at, "stopping the %d of 4 started", &started);
  EXPECT_TRUE(started >= 1 && started < 4) << text;
  EXPECT_EQ(processes_with(token), 0) << "ranks outlived their launcher";
  std::remove(out.c_str());
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
