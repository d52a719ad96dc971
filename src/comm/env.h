#pragma once
// Where this process sits in the job, read from the launcher's environment:
//   torchrun / megatron launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   OpenMPI (mpirun):           OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   SLURM (srun):               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE
// MASTER_ADDR/MASTER_PORT name the rendezvous store in every case (default 127.0.0.1:29500), and
// MT_STORE_SECRET is the job's secret that every store client presents (`megatron launch`
// generates one for a single node; other jobs set the same value for every rank).
#include <functional>
#include <string>

namespace mt::comm {

struct DistEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // which environment the values came from
  // MT_STORE_HOSTED=1: the launcher serves the rendezvous store, so rank 0 must not.
  bool store_hosted = false;
  std::string store_secret;  // MT_STORE_SECRET; empty when unset
};

using EnvLookup = std::function<const char*(const char*)>;
// Throws mt::Error naming the variable for malformed or inconsistent values.
DistEnv detect_dist_env(const EnvLookup& getenv_fn);
DistEnv detect_dist_env();  // from the process environment

// MT_STORE_SECRET ("" when unset or empty); throws mt::Error if it is too short to be a secret.
std::string read_store_secret(const EnvLookup& getenv_fn);

}  // namespace mt::comm
