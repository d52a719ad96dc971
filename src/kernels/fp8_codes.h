#pragma once
// Ops on FP8 codes that arrive ready-made, --fp8-param-gather's all-gathered weights
// (parallel/fp8_param_gather.h). They dispatch on the device as the ops of ops.def do (host: the
// CPU reference, kernels/cpu/fp8_codes.cpp; gpu: kernels/cuda/fp8_codes.cu); listed apart from
// ops.def since only that path uses them.
#include "core/fp8.h"
#include "core/tensor.h"

namespace mt::ops {

// Codes q U8 read back as fp8 * scale_inv [1] in `dtype` (the CPU: f32): fp8_fake_quantize's
// values exactly, for the scale whose inverse (fp8_snapshot_scale's) this is.
Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype);
// qt U8 [C, R] = the transpose of codes q U8 [R, C] (the data gradient's K-major weight).
void fp8_transpose_codes(const Tensor& q, Tensor& qt);

namespace host {
Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype);
void fp8_transpose_codes(const Tensor& q, Tensor& qt);
}  // namespace host
namespace gpu {
Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype);
void fp8_transpose_codes(const Tensor& q, Tensor& qt);
}  // namespace gpu

}  // namespace mt::ops
