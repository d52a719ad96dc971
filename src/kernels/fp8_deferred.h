#pragma once
// ops::fp8_gemm_into_deferred: fp8_gemm_into (ops.def) without fast accumulation, left running
// beside the work that follows until join_deferred_work (ops.def; the CPU runs it at once). An
// FP8 linear's weight gradient under MT_FP8_WGRAD_OVERLAP=1 (model/fp8.h): nothing reads dw before
// the backward pass ends, so its GEMM (compute-bound) can overlap the memory-bound casts, norms
// and activations of the layers' backward after it. The same GEMM and bits as fp8_gemm_into.
// Listed apart from ops.def (as kernels/fp8_codes.h) since only that opt-in path uses it.
#include "core/fp8.h"
#include "core/tensor.h"

namespace mt::ops {

void fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                            Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d);

namespace host {
void fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                            Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d);
}  // namespace host
namespace gpu {
void fp8_gemm_into_deferred(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                            Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d);
}  // namespace gpu

}  // namespace mt::ops
