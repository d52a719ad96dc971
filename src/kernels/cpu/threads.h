#pragma once
namespace mt::cpu {
// Sets the OpenMP thread count (n <= 0 keeps the default) and keeps OpenBLAS single-threaded: our
// threads share the gemm tiles (cpu/linear.cpp). Returns the count in use.
int set_num_threads(int n);
}  // namespace mt::cpu
