#pragma once
#include <cstdint>

namespace mt::cpu {
// Sets the OpenMP thread count (n <= 0 keeps the default) and keeps OpenBLAS single-threaded: our
// threads share the gemm tiles (cpu/linear.cpp). Returns the count in use.
int set_num_threads(int n);

// Loops over a flat buffer run on several threads only above this many elements: below it,
// fork/join costs more than the work. Elementwise loops and the fixed-chunk sums give the same
// bits for any split, so this is free to tune.
constexpr int64_t kParallelThreshold = int64_t{1} << 15;
}  // namespace mt::cpu
