#pragma once
namespace mt::cpu {
// Sets the OpenMP and OpenBLAS thread counts (n <= 0 keeps the defaults). Returns the count in use.
int set_num_threads(int n);
}  // namespace mt::cpu
