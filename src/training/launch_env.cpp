#include "training/launch_env.h"

#include <cstdlib>

namespace mt::training {

std::optional<std::string> rank_omp_wait_policy(int64_t nproc, const char* omp_num_threads, const char* wait_policy,
                                                int64_t cores) {
  if (wait_policy && *wait_policy) return std::nullopt;  // the user's choice stands
  if (cores < 1 || nproc < 1) return std::nullopt;
  // OMP_NUM_THREADS may be a list (nested levels): the first level's count is what each rank runs.
  int64_t threads = cores;
  if (omp_num_threads && *omp_num_threads) {
    char* end = nullptr;
    const long long n = std::strtoll(omp_num_threads, &end, 10);
    if (end != omp_num_threads && n > 0) threads = n;
  }
  if (nproc * threads <= cores) return std::nullopt;
  return std::string("PASSIVE");
}

}  // namespace mt::training
