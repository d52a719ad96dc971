// `megatron launch --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P] -- pretrain ...`
// Starts this node's ranks as child processes of the same binary, with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Node 0's launcher
// hosts the rendezvous store, so a rank that dies cannot take the store with it and the others
// can name it. Signals are forwarded to the children; when any child fails the others are
// stopped and the launcher exits non-zero naming the failed rank.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/env.h"
#include "comm/socket.h"
#include "comm/store.h"
#include "core/error.h"
#include "training/commands.h"
#include "training/flag_parser.h"

namespace mt {

namespace {

std::atomic<int> g_forward_signal{0};  // set by the handler, acted on by the wait loop
void on_signal(int sig) { g_forward_signal = sig; }

struct LaunchOptions {
  int64_t nproc_per_node = 1, nnodes = 1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1";
  double grace_seconds = 10;
};

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) fail("cannot find the megatron binary (/proc/self/exe)");
  buf[n] = '\0';
  return buf;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

}  // namespace

int launch_main(const std::vector<std::string>& argv) {
  auto sep = std::find(argv.begin(), argv.end(), "--");
  std::vector<std::string> own(argv.begin(), sep), child(sep == argv.end() ? sep : sep + 1, argv.end());
  LaunchOptions o;
  FlagParser p("launch");
  p.value("--nproc-per-node", &o.nproc_per_node, "processes (ranks) to start on this node");
  p.value("--nnodes", &o.nnodes, "number of nodes (default 1)");
  p.value("--node-rank", &o.node_rank, "this node's index, 0 .. nnodes-1 (default 0)");
  p.value("--master-addr", &o.master_addr, "address of node 0, where the rendezvous store runs (default 127.0.0.1)");
  p.value("--master-port", &o.master_port, "port of the rendezvous store on node 0 (default 29500)");
  p.value("--grace-seconds", &o.grace_seconds, "after a failure, how long the other ranks get to stop (default 10)");
  p.parse(own);
  if (p.help_requested()) {
    std::printf("usage: megatron launch --nproc-per-node N [flags] -- pretrain [pretrain flags]\n\n%s",
                p.help().c_str());
    return 0;
  }
  if (child.empty())
    fail("nothing to launch: put the command after '--', e.g. megatron launch --nproc-per-node 2 -- pretrain ...");
  if (o.nproc_per_node < 1) fail("--nproc-per-node must be at least 1 (got {})", o.nproc_per_node);
  if (o.nnodes < 1) fail("--nnodes must be at least 1 (got {})", o.nnodes);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("--node-rank {} is outside 0 .. {} (--nnodes {})", o.node_rank, o.nnodes - 1, o.nnodes);
  if (o.master_port < 1 || o.master_port > 65535) fail("--master-port {} is not a TCP port (1-65535)", o.master_port);
  if (child.front() == "launch") fail("'megatron launch -- launch' would start launchers; give the command to run");

  if (o.nnodes > 1 && (o.master_addr.empty() || o.master_addr == "0.0.0.0" || comm::is_loopback_address(o.master_addr)))
    fail("--master-addr '{}' cannot be reached from the other nodes (--nnodes {}); give node 0's network address",
         o.master_addr, o.nnodes);

  const int64_t world = o.nnodes * o.nproc_per_node;
  // MT_STORE_SECRET if set (the same on every node), else a fresh one only this node knows.
  std::string secret = comm::read_store_secret([](const char* n) -> const char* { return std::getenv(n); });
  if (secret.empty() && o.nnodes > 1)
    fail("--nnodes {}: set {} to the same random value on every node before 'megatron launch' (e.g. export {}=$(openssl "
         "rand -hex 16)); the ranks present it to the rendezvous store",
         o.nnodes, comm::kStoreSecretEnv, comm::kStoreSecretEnv);
  if (secret.empty()) secret = comm::random_store_secret();
  // A single node's ranks reach the store over loopback, and nothing else can.
  const std::string master_addr = o.nnodes == 1 ? "127.0.0.1" : o.master_addr;
  std::unique_ptr<comm::TcpStoreServer> store;
  if (o.node_rank == 0)
    store = std::make_unique<comm::TcpStoreServer>(master_addr, static_cast<int>(o.master_port), secret);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaction(sig, &sa, nullptr);

  const std::string exe = self_exe();
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int64_t i = 0; i < o.nproc_per_node; ++i) {
    const int64_t rank = o.node_rank * o.nproc_per_node + i;
    pid_t pid = ::fork();
    if (pid < 0) fail("fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) sigaction(sig, &dfl, nullptr);
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
      ::setenv("MT_STORE_HOSTED", "1", 1);
      ::setenv(comm::kStoreSecretEnv, secret.c_str(), 1);
      std::vector<char*> args;
      args.push_back(const_cast<char*>(exe.c_str()));
      for (auto& a : child) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(exe.c_str(), args.data());
      std::fprintf(stderr, "megatron launch: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }

  std::vector<bool> running(pids.size(), true);
  size_t left = pids.size();
  int exit_code = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  auto stop_others = [&](int sig) {
    for (size_t i = 0; i < pids.size(); ++i)
      if (running[i]) ::kill(pids[i], sig);
  };
  while (left > 0) {
    if (int sig = g_forward_signal.exchange(0)) {
      stop_others(sig);  // forward: the ranks decide (e.g. save and exit)
      if (!stopping && sig != SIGUSR1 && sig != SIGUSR2) {
        stopping = true;
        exit_code = 128 + sig;
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(o.grace_seconds));
      }
    }
    bool reaped = false;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!running[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      running[i] = false;
      --left;
      reaped = true;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !stopping) {
        const int64_t rank = o.node_rank * o.nproc_per_node + static_cast<int64_t>(i);
        std::fprintf(stderr, "megatron launch: error: rank %ld (local rank %zu, pid %d) %s; stopping the other %zu "
                     "rank(s) on this node\n",
                     static_cast<long>(rank), i, pids[i], describe(status).c_str(), left);
        std::fflush(stderr);
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        stopping = true;
        stop_others(SIGTERM);
        stop_deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(o.grace_seconds));
      }
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      stop_others(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return exit_code;
}

}  // namespace mt
