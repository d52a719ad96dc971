#include "kernels/cpu/threads.h"

#include <cblas.h>
#include <omp.h>

namespace mt::cpu {

int set_num_threads(int n) {
  if (n > 0) {
    omp_set_num_threads(n);
    openblas_set_num_threads(1);  // our threads share the gemm tiles (cpu/linear.cpp)
  }
  return omp_get_max_threads();
}

}  // namespace mt::cpu
