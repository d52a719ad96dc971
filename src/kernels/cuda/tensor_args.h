#pragma once
// Argument checks and dtype dispatch for the ops::gpu functions written beside their kernels
// (vocab_parallel.cu, moe_routing.cu, moe_permute.cu): internal invariants (MT_CHECK), since the
// model passes these right. Host code, included by .cu files.
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/ops_cuda.h"

namespace mt::ops::gpu {

inline void check_cuda_tensor(const Tensor& t, DType want, const char* what) {
  MT_CHECK(t.device() == Device::CUDA && t.dtype() == want, "{}: expected a CUDA {} tensor, got {} {} on {}", what,
           dtype_name(want), dtype_name(t.dtype()), t.shape_str(), t.device() == Device::CPU ? "the CPU" : "the GPU");
}

// t's data as T after checking its device, dtype (`want`) and element count.
template <typename T>
T* cuda_data(const Tensor& t, DType want, int64_t numel, const char* what) {
  check_cuda_tensor(t, want, what);
  MT_CHECK(t.numel() == numel, "{}: expected {} elements, got {}", what, numel, t.shape_str());
  return t.data<T>();
}

inline void check_float_tensor(const Tensor& t, const char* what) {
  const DType d = t.dtype();
  MT_CHECK(t.device() == Device::CUDA && (d == DType::BF16 || d == DType::F16 || d == DType::F32),
           "{}: expected a CUDA bf16, fp16 or f32 tensor, got {} {}", what, dtype_name(t.dtype()), t.shape_str());
}

// Calls f with the typed pointer of a CUDA bf16, fp16 or f32 tensor.
template <typename F>
void with_float_type(const Tensor& t, F&& f, const char* what = "with_float_type") {
  check_float_tensor(t, what);
  if (t.dtype() == DType::BF16) f(t.data<cuda::bf16>());
  else if (t.dtype() == DType::F16) f(t.data<cuda::f16>());
  else f(t.data<float>());
}

}  // namespace mt::ops::gpu
