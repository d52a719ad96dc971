#include "kernels/fp8_codes.h"

#include "core/error.h"

namespace mt::ops {

Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype) {
  return q.device() == Device::CPU ? host::fp8_dequantize(q, scale_inv, format, dtype)
                                   : gpu::fp8_dequantize(q, scale_inv, format, dtype);
}

void fp8_transpose_codes(const Tensor& q, Tensor& qt) {
  if (q.device() == Device::CPU) return host::fp8_transpose_codes(q, qt);
  gpu::fp8_transpose_codes(q, qt);
}

#ifndef MT_HAVE_CUDA
// A build without the CUDA backend (as kernels/cuda_absent.cpp): no CUDA tensor exists to get here.
namespace gpu {
Tensor fp8_dequantize(const Tensor&, const Tensor&, Fp8Format, DType) {
  fail("ops::fp8_dequantize: this build has no CUDA backend");
}
void fp8_transpose_codes(const Tensor&, Tensor&) { fail("ops::fp8_transpose_codes: this build has no CUDA backend"); }
}  // namespace gpu
#endif

}  // namespace mt::ops
