// `megatron launch --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P] -- pretrain ...`
// Starts this node's ranks as child processes of the same binary, with torchrun's environment
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus the job's store
// secret (MT_STORE_SECRET). Node 0's launcher hosts the rendezvous store, so a rank that dies
// cannot take the store with it and the others can name it; for a single node it listens on
// 127.0.0.1 only, for several on --master-addr only. Signals are forwarded to the children; when
// any child fails the others are stopped and the launcher exits with the status of the first
// one that failed (128 + signal for a signal, as shells report it), naming it.
//
// MT_LAUNCH_TEST_FORK_DELAY_MS (tests only) pauses between starting ranks, so that a test can
// signal the launcher while it is still starting them.
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/env.h"
#include "comm/socket.h"
#include "comm/store.h"
#include "core/checked.h"
#include "core/error.h"
#include "training/commands.h"
#include "training/flag_parser.h"
#include "training/launch_env.h"

extern char** environ;

namespace mt {

namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int64_t kRanksPerCore = 4;   // beyond this, CPU ranks only thrash
constexpr int64_t kMinRankCap = 8;     // GPU nodes: one rank per GPU, whatever the core count
constexpr int64_t kStoreSpareFiles = 64;  // the launcher's own files beside one socket per rank

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

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{}", abbrev) : fmt::format("{}", strsignal(sig));
}

std::string describe(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), signal_name(WTERMSIG(status)));
  return "stopped";
}

// The status a shell would report for it.
int shell_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

int64_t available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

// Every count is bounded by what this machine can run, before anything is started.
void check_options(const LaunchOptions& o) {
  if (o.nproc_per_node < 1) fail("--nproc-per-node must be at least 1 (got {})", o.nproc_per_node);
  const int64_t cores = available_cores();
  const int64_t cap = std::max(kMinRankCap, kRanksPerCore * cores);
  if (o.nproc_per_node > cap)
    fail("--nproc-per-node {} is more than this machine runs usefully: at most {} ({} per available CPU core, {} cores, "
         "and at least {}); start fewer ranks per node",
         o.nproc_per_node, cap, kRanksPerCore, cores, kMinRankCap);
  rlimit procs{};
  if (::getrlimit(RLIMIT_NPROC, &procs) == 0 && procs.rlim_cur != RLIM_INFINITY &&
      static_cast<uint64_t>(o.nproc_per_node) >= procs.rlim_cur)
    fail("--nproc-per-node {} reaches this user's process limit ({}, see ulimit -u); start fewer ranks",
         o.nproc_per_node, static_cast<uint64_t>(procs.rlim_cur));
  if (o.nnodes < 1) fail("--nnodes must be at least 1 (got {})", o.nnodes);
  const int64_t world = checked_mul(o.nnodes, o.nproc_per_node, "--nnodes x --nproc-per-node");
  if (world > INT_MAX) fail("--nnodes {} x --nproc-per-node {} = {} ranks, more than a job can have ({})", o.nnodes,
                            o.nproc_per_node, world, INT_MAX);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    fail("--node-rank {} is outside 0 .. {} (--nnodes {})", o.node_rank, o.nnodes - 1, o.nnodes);
  if (o.master_port < 1 || o.master_port > 65535) fail("--master-port {} is not a TCP port (1-65535)", o.master_port);
  if (!std::isfinite(o.grace_seconds) || o.grace_seconds < 0 || o.grace_seconds > 3600)
    fail("--grace-seconds {} is not between 0 and 3600", o.grace_seconds);
  if (o.nnodes > 1 && (o.master_addr.empty() || o.master_addr == "0.0.0.0" || comm::is_loopback_address(o.master_addr)))
    fail("--master-addr '{}' cannot be reached from the other nodes (--nnodes {}); give node 0's network address",
         o.master_addr, o.nnodes);
}

// Node 0's store keeps one connection per rank of the whole job open: make sure it may.
void ensure_store_files(int64_t world) {
  const int64_t need = world + kStoreSpareFiles;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY ||
      static_cast<uint64_t>(need) <= files.rlim_cur)
    return;
  if (files.rlim_max == RLIM_INFINITY || static_cast<uint64_t>(need) <= files.rlim_max) {
    files.rlim_cur = static_cast<rlim_t>(need);
    if (::setrlimit(RLIMIT_NOFILE, &files) == 0) return;
  }
  fail("{} ranks need about {} open files for the rendezvous store on node 0, above this machine's limit of {} (raise "
       "it with ulimit -n)",
       world, need, static_cast<uint64_t>(files.rlim_max));
}

// The job's secret: MT_STORE_SECRET if set (it must be the same on every node), else a fresh
// random one, which only a single node can use since no other node would know it.
std::string job_secret(const LaunchOptions& o) {
  std::string secret = comm::read_store_secret([](const char* n) -> const char* { return std::getenv(n); });
  if (!secret.empty()) return secret;
  if (o.nnodes > 1)
    fail("--nnodes {}: set {} to the same random value on every node before 'megatron launch' (e.g. export {}=$(openssl "
         "rand -hex 16)); the ranks present it to the rendezvous store",
         o.nnodes, comm::kStoreSecretEnv, comm::kStoreSecretEnv);
  return comm::random_store_secret();
}

// This process's environment with `set` replacing (or adding) those variables.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; })) env.push_back(entry);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The signals the launcher takes itself: those that end the job and SIGUSR1/2, which it only
// forwards (the ranks may save a checkpoint), except any the parent set to be ignored (nohup):
// the launcher and its ranks keep ignoring those.
struct Signals {
  sigset_t stopping;  // SIGINT, SIGTERM, SIGHUP
  sigset_t waited;    // those, SIGUSR1/2 and SIGCHLD
  sigset_t original;  // the mask to restore in the ranks
};

Signals block_signals() {
  Signals s;
  sigemptyset(&s.stopping);
  sigemptyset(&s.waited);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2}) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;
    sigaddset(&s.waited, sig);
    if (sig != SIGUSR1 && sig != SIGUSR2) sigaddset(&s.stopping, sig);
  }
  // An inherited SIG_IGN for SIGCHLD would reap the ranks behind our back (waitpid would never
  // see them end).
  ::signal(SIGCHLD, SIG_DFL);
  sigaddset(&s.waited, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &s.waited, &s.original);
  return s;
}

// Waits up to `ms` for one of `set` (blocked) to arrive; returns it, or 0.
int wait_signal(const sigset_t& set, int64_t ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>((ms % 1000) * 1000000)};
  const int sig = ::sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

struct Rank {
  pid_t pid;
  int64_t local;
  bool running = true;
};

struct Started {
  std::vector<Rank> ranks;
  int signal = 0;     // a stopping signal that came while starting them
  std::string error;  // a fork that failed
};

// Forks and execs this node's ranks; stops early on a stopping signal or a failed fork.
Started start_ranks(const LaunchOptions& o, const std::vector<std::string>& command, const std::string& master_addr,
                    const std::string& secret, const Signals& sigs) {
  const int64_t world = o.nnodes * o.nproc_per_node;
  const std::string exe = self_exe();
  std::vector<std::string> args{exe};
  args.insert(args.end(), command.begin(), command.end());
  std::vector<char*> argv = c_strings(args);
  const std::string exec_error = fmt::format("megatron launch: cannot run {}\n", exe);
  int64_t delay_ms = 0;
  if (const char* d = std::getenv("MT_LAUNCH_TEST_FORK_DELAY_MS")) delay_ms = std::clamp(std::atoll(d), 0LL, 10000LL);
  // Ranks that share cores wait for each other passively (launch_env.h says why).
  const std::optional<std::string> wait_policy = training::rank_omp_wait_policy(
      o.nproc_per_node, std::getenv("OMP_NUM_THREADS"), std::getenv("OMP_WAIT_POLICY"),
      static_cast<int64_t>(std::thread::hardware_concurrency()));
  Started out;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int64_t i = 0; i < o.nproc_per_node; ++i) {
    if ((out.signal = wait_signal(sigs.stopping, i == 0 ? 0 : delay_ms))) break;
    const int64_t rank = o.node_rank * o.nproc_per_node + i;
    // Built before fork: the child only restores the signal mask and execs.
    std::vector<std::pair<std::string, std::string>> set{{"RANK", std::to_string(rank)},
                                                         {"WORLD_SIZE", std::to_string(world)},
                                                         {"LOCAL_RANK", std::to_string(i)},
                                                         {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
                                                         {"GROUP_RANK", std::to_string(o.node_rank)},
                                                         {"MASTER_ADDR", master_addr},
                                                         {"MASTER_PORT", std::to_string(o.master_port)},
                                                         {"MT_STORE_HOSTED", "1"},
                                                         {comm::kStoreSecretEnv, secret}};
    if (wait_policy) set.emplace_back("OMP_WAIT_POLICY", *wait_policy);
    std::vector<std::string> env = child_environment(set);
    std::vector<char*> envp = c_strings(env);
    const pid_t pid = ::fork();
    if (pid < 0) {
      out.error = fmt::format("cannot start local rank {} of {}: fork failed ({})", i, o.nproc_per_node,
                              std::strerror(errno));
      break;
    }
    if (pid == 0) {
      ::pthread_sigmask(SIG_SETMASK, &sigs.original, nullptr);
      ::execve(exe.c_str(), argv.data(), envp.data());
      if (::write(2, exec_error.data(), exec_error.size()) < 0) {
      }
      ::_exit(127);
    }
    out.ranks.push_back({pid, i});
  }
  return out;
}

// Forwards signals and waits for every rank. When one fails (or a stopping signal comes, or
// starting failed), the others get SIGTERM and, after the grace period, SIGKILL. Returns the
// launcher's exit status.
int supervise(const LaunchOptions& o, Started& started, const Signals& sigs) {
  std::vector<Rank>& ranks = started.ranks;
  size_t left = ranks.size();
  int exit_code = 0;
  bool stopping = false;
  auto stop_deadline = SteadyClock::time_point::max();
  auto signal_running = [&](int sig) {
    for (const Rank& r : ranks)
      if (r.running) ::kill(r.pid, sig);
  };
  auto stop_all = [&](int sig, int code) {
    signal_running(sig);
    stopping = true;
    exit_code = code;
    stop_deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                             std::chrono::duration<double>(o.grace_seconds));
  };
  if (started.signal) {
    std::fprintf(stderr, "megatron launch: %s while starting ranks: stopping the %zu of %ld started\n",
                 signal_name(started.signal).c_str(), ranks.size(), static_cast<long>(o.nproc_per_node));
    stop_all(started.signal, 128 + started.signal);
  } else if (!started.error.empty()) {
    stop_all(SIGTERM, 2);
  }
  // A stopping signal from outside (SLURM's SIGTERM before preemption, Ctrl-C) is forwarded and
  // the ranks decide: with --exit-signal-handler they finish the iteration, save and exit 0, which
  // can take longer than --grace-seconds, so only a second stopping signal starts the grace
  // period before SIGKILL. The launcher exits 0 when every rank did.
  bool by_signal = false, all_ok = true;
  while (left > 0) {
    if (const int sig = wait_signal(sigs.waited, 100); sig && sig != SIGCHLD) {
      if (!stopping && sigismember(&sigs.stopping, sig)) {
        stop_all(sig, 128 + sig);
        by_signal = true;
        stop_deadline = SteadyClock::time_point::max();
      } else {
        signal_running(sig);  // forward: the ranks decide (e.g. save and exit)
        if (by_signal && sigismember(&sigs.stopping, sig) && stop_deadline == SteadyClock::time_point::max())
          stop_deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                   std::chrono::duration<double>(o.grace_seconds));
      }
    }
    // Reap everything that ended. Among failures seen together, a rank killed by a signal is
    // named first: the others usually exit with a code because a peer vanished.
    const Rank* first_failed = nullptr;
    int first_status = 0;
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = std::find_if(ranks.begin(), ranks.end(), [&](const Rank& r) { return r.pid == pid && r.running; });
      if (it == ranks.end()) continue;
      it->running = false;
      --left;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      all_ok = all_ok && ok;
      if (!ok && (!first_failed || (WIFSIGNALED(status) && !WIFSIGNALED(first_status)))) {
        first_failed = &*it;
        first_status = status;
      }
    }
    if (first_failed && !stopping) {
      const int64_t rank = o.node_rank * o.nproc_per_node + first_failed->local;
      std::fprintf(stderr, "megatron launch: error: rank %ld (local rank %ld, pid %d) %s; stopping the other %zu "
                   "rank(s) on this node\n",
                   static_cast<long>(rank), static_cast<long>(first_failed->local), first_failed->pid,
                   describe(first_status).c_str(), left);
      std::fflush(stderr);
      stop_all(SIGTERM, shell_status(first_status));
    }
    if (stopping && SteadyClock::now() > stop_deadline) {
      signal_running(SIGKILL);
      stop_deadline = SteadyClock::time_point::max();
    }
  }
  if (by_signal && all_ok) {
    std::fprintf(stderr, "megatron launch: every rank exited 0 after the signal\n");
    return 0;
  }
  return exit_code;
}

}  // namespace

namespace {

// torchrun's spellings of the launch flags (--nproc_per_node, --master_addr=...) as ours.
std::string torchrun_spelling(const std::string& tok) {
  static const char* kTorchrun[] = {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port"};
  const std::string name = tok.substr(0, tok.find('='));
  for (const char* t : kTorchrun)
    if (name == t) {
      std::string dashed = tok;
      std::replace(dashed.begin(), dashed.begin() + static_cast<std::ptrdiff_t>(name.size()), '_', '-');
      return dashed;
    }
  return tok;
}

// Splits `launch`'s own flags from the command: at `--`, or, as torchrun is called, at the first
// word that is not a flag or a flag's value (every launch flag takes one). Megatron-LM's scripts
// name pretrain_gpt.py there; it means `pretrain`.
void split_command(const std::vector<std::string>& argv, std::vector<std::string>& own, std::vector<std::string>& child) {
  size_t i = 0;
  while (i < argv.size() && argv[i] != "--" && argv[i].rfind("--", 0) == 0) {
    own.push_back(torchrun_spelling(argv[i]));
    const bool inline_value = argv[i].find('=') != std::string::npos || argv[i] == "--help" || argv[i] == "-h";
    ++i;
    if (!inline_value && i < argv.size() && argv[i] != "--") own.push_back(argv[i++]);
  }
  if (i < argv.size() && argv[i] == "--") ++i;
  child.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
  if (!child.empty() && std::filesystem::path(child.front()).filename() == "pretrain_gpt.py") child.front() = "pretrain";
}

}  // namespace

int launch_main(const std::vector<std::string>& argv) {
  std::vector<std::string> own, child;
  split_command(argv, own, child);
  LaunchOptions o;
  FlagParser p("launch");
  p.value("--nproc-per-node", &o.nproc_per_node, "processes (ranks) to start on this node");
  p.value("--nnodes", &o.nnodes, "number of nodes (default 1)");
  p.value("--node-rank", &o.node_rank, "this node's index, 0 .. nnodes-1 (default 0)");
  p.value("--master-addr", &o.master_addr,
          "address of node 0, where the rendezvous store runs (default 127.0.0.1; a single node always uses 127.0.0.1)");
  p.value("--master-port", &o.master_port, "port of the rendezvous store on node 0 (default 29500)");
  p.value("--grace-seconds", &o.grace_seconds, "after a failure, how long the other ranks get to stop (default 10)");
  p.parse(own);
  if (p.help_requested()) {
    std::printf("usage: megatron launch --nproc-per-node N [flags] -- pretrain [pretrain flags]\n"
                "   or, as torchrun is called: megatron launch --nproc_per_node N ... pretrain_gpt.py [pretrain flags]\n\n%s\n"
                "environment: %s, the job's store secret: generated for a single node; for several nodes,\n"
                "  export the same random value on every node (e.g. $(openssl rand -hex 16))\n",
                p.help().c_str(), comm::kStoreSecretEnv);
    return 0;
  }
  if (child.empty())
    fail("nothing to launch: put the command after '--', e.g. megatron launch --nproc-per-node 2 -- pretrain ...");
  if (child.front() == "launch") fail("'megatron launch -- launch' would start launchers; give the command to run");
  check_options(o);
  const std::string secret = job_secret(o);
  // A single node's ranks reach the store over loopback, and nothing else can.
  const std::string master_addr = o.nnodes == 1 ? "127.0.0.1" : o.master_addr;

  // Signals are blocked and taken with sigtimedwait: no handler races the fork loop, and one
  // that arrives while ranks are being started stops it. Blocked before the store's thread
  // exists, which inherits the mask.
  const Signals sigs = block_signals();
  std::unique_ptr<comm::TcpStoreServer> store;
  if (o.node_rank == 0) {
    ensure_store_files(o.nnodes * o.nproc_per_node);
    store = std::make_unique<comm::TcpStoreServer>(master_addr, static_cast<int>(o.master_port), secret);
  }
  Started started = start_ranks(o, child, master_addr, secret, sigs);
  const int exit_code = supervise(o, started, sigs);
  if (!started.error.empty()) fail("{}; the {} rank(s) already started were stopped", started.error, started.ranks.size());
  return exit_code;
}

}  // namespace mt
