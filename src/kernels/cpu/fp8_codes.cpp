// The ops of FP8 codes that arrive ready-made (--fp8-param-gather's all-gathered weights): read
// back with their scale_inv, and transposed for the data gradient. The CPU reference of
// kernels/cuda/fp8_codes.cu.
#include <cstdint>

#include "core/error.h"
#include "core/fp8.h"
#include "kernels/fp8_codes.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

Tensor fp8_dequantize(const Tensor& q, const Tensor& scale_inv, Fp8Format format, DType dtype) {
  MT_CHECK(q.device() == Device::CPU && q.dtype() == DType::U8, "fp8_dequantize: CPU U8 codes, got {} {}",
           dtype_name(q.dtype()), q.shape_str());
  MT_CHECK(dtype == DType::F32, "fp8_dequantize: the CPU writes f32, asked for {}", dtype_name(dtype));
  check_vector(scale_inv, Device::CPU, DType::F32, 1, "fp8_dequantize (scale_inv)");
  const float inv = *scale_inv.data<float>();
  Tensor y = Tensor::empty(q.shape());
  const uint8_t* in = q.data<uint8_t>();
  float* out = y.data<float>();
  // fp8_fake_quantize's fp8_round(v) * inv with the same inv: fp8_round is decode(encode(v)).
  for (int64_t i = 0, n = q.numel(); i < n; ++i) out[i] = fp8_decode(in[i], format) * inv;
  return y;
}

void fp8_transpose_codes(const Tensor& q, Tensor& qt) {
  MT_CHECK(q.device() == Device::CPU && q.dtype() == DType::U8 && q.ndim() == 2,
           "fp8_transpose_codes: CPU U8 [R, C] codes, got {} {}", dtype_name(q.dtype()), q.shape_str());
  const int64_t R = q.dim(0), C = q.dim(1);
  check_vector(qt, Device::CPU, DType::U8, R * C, "fp8_transpose_codes (qt)");
  const uint8_t* in = q.data<uint8_t>();
  uint8_t* out = qt.data<uint8_t>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[c * R + r] = in[r * C + c];
}

}  // namespace mt::ops::host
