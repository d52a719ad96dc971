#pragma once
// What `megatron launch` adds to its ranks' environment beyond torchrun's variables.
#include <cstdint>
#include <optional>
#include <string>

namespace mt::training {

// OMP_WAIT_POLICY for the ranks: "PASSIVE" when this node's ranks would run more OpenMP threads
// than it has cores (nproc x OMP_NUM_THREADS, or nproc x cores where OMP_NUM_THREADS is unset),
// and the user has not set a policy. Why: OpenMP's threads spin between parallel regions by
// default, which is right on cores of their own; ranks sharing cores then spin in each other's
// time slices (4 CPU ranks of 2 threads on 2 cores ran a test job 2.8x slower: 20.4 s against
// 7.4 s with PASSIVE). Otherwise nullopt: the environment is left as it is.
// omp_num_threads / wait_policy: the launcher's own variables (null where unset).
std::optional<std::string> rank_omp_wait_policy(int64_t nproc, const char* omp_num_threads, const char* wait_policy,
                                                int64_t cores);

}  // namespace mt::training
