#pragma once
// Runs a function as N ranks in forked processes, the way 'megatron launch' would start them:
// the test process hosts the rendezvous store (MT_STORE_HOSTED=1) on a free port and sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and the store's secret (MT_STORE_SECRET) in each child. Each child's stderr goes to a file the
// parent returns, so a test can check the error a rank printed. Children leave with _exit and
// never return into gtest. Fork before the parent uses OpenMP (libgomp is not fork-safe).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/store.h"
#include "comm/world.h"

namespace mt::testing {

struct RankResult {
  int exit_code = -1;      // -1 while running / killed by the deadline
  int signal = 0;          // the signal that ended it, if any
  std::string stderr_text;
  double seconds = 0;      // when it ended, from the start
};

struct RankOptions {
  std::chrono::milliseconds comm_timeout{30000};
  std::chrono::seconds deadline{120};  // parent kills every child still running after this
  std::vector<std::pair<std::string, std::string>> env;  // extra environment for the children
  // GPU ranks: called in each child before its World exists (picks the GPU, returns NCCL setup).
  std::function<comm::DeviceComm(int rank)> device;
};

inline std::vector<RankResult> run_ranks(int n, const std::function<void(comm::World&)>& fn,
                                         const RankOptions& opt = {}) {
  const std::string secret = comm::random_store_secret();
  comm::TcpStoreServer server("127.0.0.1", 0, secret);
  std::string dir = "/tmp/mt_ranks_" + std::to_string(::getpid()) + "_" + std::to_string(server.port());
  std::string mk = "mkdir -p " + dir;
  if (std::system(mk.c_str()) != 0) return {};
  std::vector<pid_t> pids;
  const auto t0 = std::chrono::steady_clock::now();
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int fd = ::open((dir + "/rank" + std::to_string(r) + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(server.port()).c_str(), 1);
      ::setenv("MT_STORE_HOSTED", "1", 1);
      ::setenv(comm::kStoreSecretEnv, secret.c_str(), 1);
      for (auto& [k, v] : opt.env) ::setenv(k.c_str(), v.c_str(), 1);
      int code = 0;
      try {
        comm::World world(comm::detect_dist_env(), opt.comm_timeout, opt.device ? opt.device(r) : comm::DeviceComm{});
        fn(world);
        world.shutdown();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d error: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> res(static_cast<size_t>(n));
  std::vector<bool> running(static_cast<size_t>(n), true);
  int left = n;
  while (left > 0) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool late = secs > static_cast<double>(opt.deadline.count());
    for (int r = 0; r < n; ++r) {
      if (!running[static_cast<size_t>(r)]) continue;
      if (late) ::kill(pids[static_cast<size_t>(r)], SIGKILL);
      int status = 0;
      pid_t p = ::waitpid(pids[static_cast<size_t>(r)], &status, late ? 0 : WNOHANG);
      if (p != pids[static_cast<size_t>(r)]) continue;
      auto& rr = res[static_cast<size_t>(r)];
      rr.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      rr.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      rr.seconds = secs;
      running[static_cast<size_t>(r)] = false;
      --left;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream f(dir + "/rank" + std::to_string(r) + ".err");
    std::stringstream ss;
    ss << f.rdbuf();
    res[static_cast<size_t>(r)].stderr_text = ss.str();
  }
  std::string rm = "rm -rf " + dir;
  if (std::system(rm.c_str()) != 0) {
  }
  return res;
}

}  // namespace mt::testing
