#include "kernels/fp8_deferred.h"

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops {

void fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                            Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d) {
  if (a.device() == Device::CPU)
    return host::fp8_gemm_into_deferred(a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, d);
  gpu::fp8_gemm_into_deferred(a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, d);
}

// The CPU has nothing to overlap: the GEMM now.
void host::fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                                  Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d) {
  host::fp8_gemm_into(a, a_format, a_scale_inv, b, b_format, b_scale_inv, c, d, false);
}

#ifndef MT_HAVE_CUDA
// A build without the CUDA backend (as kernels/cuda_absent.cpp): no CUDA tensor exists to get here.
void gpu::fp8_gemm_into_deferred(const Tensor&, Fp8Format, const Tensor&, const Tensor&, Fp8Format, const Tensor&,
                                 const Tensor*, Tensor&) {
  fail("ops::fp8_gemm_into_deferred: this build has no CUDA backend");
}
#endif

}  // namespace mt::ops
