#pragma once
// The two implementations of every op of ops.def, declared from that list: ops::host (the fp32
// CPU reference, kernels/cpu/tensor_ops.cpp and its neighbours) and ops::gpu (the CUDA backend,
// kernels/cuda/tensor_ops.cpp and its neighbours; in a build without CUDA, cuda_absent.cpp).
// Only ops.cpp and the implementations include this: everyone else calls ops::<name>.
#include "core/error.h"
#include "kernels/ops.h"

namespace mt::ops {

#define MT_DEFAULT(v)
#define MT_OP(result, name, on, params, args) result name params;
namespace host {
#include "kernels/ops.def"
}  // namespace host
namespace gpu {
#include "kernels/ops.def"
}  // namespace gpu
#undef MT_OP
#undef MT_DEFAULT

// Argument checks both implementations make (internal invariants: the callers pass these right).
inline void check_vector(const Tensor& t, Device device, DType dtype, int64_t n, const char* what) {
  MT_CHECK(t.device() == device && t.dtype() == dtype && t.numel() == n,
           "{}: expected a {} {} tensor of {} elements, got {} {} on the {}", what,
           device == Device::CPU ? "CPU" : "CUDA", dtype_name(dtype), n, dtype_name(t.dtype()), t.shape_str(),
           t.device() == Device::CPU ? "CPU" : "GPU");
}
// accumulate_masked_loss: losses and mask f32 [n], acc one 8-byte cell, all on `device`.
inline void check_masked_loss(const Tensor& losses, const Tensor& mask, const Tensor& acc, Device device) {
  check_vector(losses, device, DType::F32, losses.numel(), "accumulate_masked_loss (losses)");
  check_vector(mask, device, DType::F32, losses.numel(), "accumulate_masked_loss (mask)");
  MT_CHECK(acc.device() == device && acc.nbytes() == sizeof(double),
           "accumulate_masked_loss: the accumulator must be one 8-byte cell on the same device, got {} {}",
           dtype_name(acc.dtype()), acc.shape_str());
}

}  // namespace mt::ops
