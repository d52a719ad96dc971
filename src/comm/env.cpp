#include "comm/env.h"

#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "comm/store.h"
#include "core/error.h"

namespace mt::comm {

namespace {
int parse_int(const char* name, const char* v, int lo) {
  int out = 0;
  const char* end = v + std::strlen(v);
  auto [p, ec] = std::from_chars(v, end, out);
  // from_chars reports a value beyond int as out of range: refused, never narrowed.
  if (ec != std::errc() || p != end || out < lo)
    fail("environment variable {}='{}' is not an integer in {} .. {}", name, v, lo, INT_MAX);
  return out;
}
}  // namespace

DistEnv detect_dist_env(const EnvLookup& env) {
  DistEnv d;
  struct Scheme {
    const char *rank, *size, *local_rank, *local_size, *source;
  };
  // OpenMPI before SLURM: mpirun inside an allocation sets both, and OMPI's are the job's.
  const Scheme schemes[] = {
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "torchrun-style environment"},
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
       "OpenMPI environment"},
      {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM environment"},
  };
  for (const Scheme& s : schemes) {
    const char* r = env(s.rank);
    const char* n = env(s.size);
    if (!r && !n) continue;
    if (!r || !n) fail("{} is set but {} is not; set both (or neither, for a single process)", r ? s.rank : s.size,
                       r ? s.size : s.rank);
    d.rank = parse_int(s.rank, r, 0);
    d.world_size = parse_int(s.size, n, 1);
    if (d.rank >= d.world_size) fail("{}={} is not below {}={}", s.rank, d.rank, s.size, d.world_size);
    if (const char* lr = env(s.local_rank)) d.local_rank = parse_int(s.local_rank, lr, 0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)"; only the leading count matters.
    if (const char* ls = env(s.local_size)) {
      std::string v(ls);
      v = v.substr(0, v.find('('));
      d.local_world_size = parse_int(s.local_size, v.c_str(), 1);
    } else {
      d.local_world_size = d.world_size;
    }
    d.source = s.source;
    break;
  }
  if (const char* a = env("MASTER_ADDR"); a && *a) d.master_addr = a;
  if (const char* p = env("MASTER_PORT"); p && *p) {
    d.master_port = parse_int("MASTER_PORT", p, 1);
    if (d.master_port > 65535) fail("MASTER_PORT={} is not a TCP port (1-65535)", d.master_port);
  }
  if (const char* h = env("MT_STORE_HOSTED"); h && std::strcmp(h, "1") == 0) d.store_hosted = true;
  d.store_secret = read_store_secret(env);
  return d;
}

std::string read_store_secret(const EnvLookup& env) {
  const char* v = env(kStoreSecretEnv);
  if (!v || !*v) return "";
  const size_t n = std::strlen(v);
  // 16 characters of `openssl rand -hex 8` are the least that resist guessing over the network;
  // the upper bound keeps the store's first message small.
  if (n < 16 || n > 256)
    fail("{} is {} characters long; use 16 to 256 random ones, the same for every rank (e.g. export {}=$(openssl rand "
         "-hex 16))",
         kStoreSecretEnv, n, kStoreSecretEnv);
  return v;
}

DistEnv detect_dist_env() {
  return detect_dist_env([](const char* n) -> const char* { return std::getenv(n); });
}

}  // namespace mt::comm
