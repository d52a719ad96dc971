#pragma once
// Shared by the tensor-core and generic attention kernels.
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

// delta[r] = sum_d dout[r, d] * out[r, d] (fp32), the row term of the softmax backward:
// dS = P * (dP - delta), since sum_j P_ij dP_ij = dO_i . O_i (also with dropout).
template <typename T>
void attention_delta(const T* out, const T* dout, float* delta, int64_t rows, int64_t D, cudaStream_t s);

}  // namespace mt::cuda
