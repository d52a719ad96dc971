// FP8 ops of ops.def on the CPU: the exact emulation the GPU's kernels are checked against.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/fp8_scale.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

namespace {

void check_scalar(const Tensor& t, DType dtype, const char* what) {
  check_vector(t, Device::CPU, dtype, 1, what);
}

// max |v| with NaN ignored (std::fmax returns the other operand), inf kept.
float amax_of(const float* x, int64_t n) {
  float m = 0.f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

}  // namespace

void fp8_amax(const Tensor& x, Tensor& amax) {
  check_scalar(amax, DType::F32, "fp8_amax (amax)");
  MT_CHECK(x.dtype() == DType::F32, "fp8_amax: the CPU takes f32, got {}", dtype_name(x.dtype()));
  *amax.data<float>() = amax_of(x.data<float>(), x.numel());
}

void fp8_delayed_update(Tensor& history, Tensor& scale, const Tensor& amax, float fp8_max, int margin, bool use_max) {
  check_scalar(scale, DType::F32, "fp8_delayed_update (scale)");
  check_scalar(amax, DType::F32, "fp8_delayed_update (amax)");
  MT_CHECK(history.dtype() == DType::F32 && history.numel() >= 1, "fp8_delayed_update: history f32 [L >= 1], got {}",
           history.shape_str());
  float* h = history.data<float>();
  const int64_t L = history.numel();
  h[0] = *amax.data<float>();
  float a = h[0];
  if (use_max)
    for (int64_t i = 1; i < L; ++i) a = std::fmax(a, h[i]);
  float* s = scale.data<float>();
  *s = fp8::scale_from_amax(a, fp8::scaled_max(fp8_max, margin), *s);
  std::rotate(h, h + 1, h + L);  // slot i <- slot i+1, the last <- slot 0
  h[0] = 0.f;
}

void fp8_current_scale(const Tensor& amax, Tensor& scale, float fp8_max) {
  check_scalar(scale, DType::F32, "fp8_current_scale (scale)");
  check_scalar(amax, DType::F32, "fp8_current_scale (amax)");
  *scale.data<float>() = fp8::scale_from_amax(*amax.data<float>(), fp8_max, 1.f);
}

Tensor fp8_fake_quantize(const Tensor& x, const Tensor& scale, Fp8Format format, Tensor& saturated) {
  check_scalar(scale, DType::F32, "fp8_fake_quantize (scale)");
  check_scalar(saturated, DType::I64, "fp8_fake_quantize (saturated)");
  MT_CHECK(x.dtype() == DType::F32, "fp8_fake_quantize: the CPU takes f32, got {}", dtype_name(x.dtype()));
  const float s = *scale.data<float>(), inv = 1.f / s, mx = fp8_max(format);
  Tensor y = Tensor::empty(x.shape());
  const float* in = x.data<float>();
  float* out = y.data<float>();
  int64_t clipped = 0;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = in[i] * s;
    clipped += std::fabs(v) > mx;
    out[i] = fp8_round(v, format) * inv;
  }
  *saturated.data<int64_t>() += clipped;
  return y;
}

Tensor fp8_fake_quantize_blocks(const Tensor& x, Fp8Format format, int64_t tile_r, int64_t tile_c, Tensor& scales) {
  MT_CHECK(x.dtype() == DType::F32 && x.ndim() == 2 && tile_r > 0 && tile_c > 0,
           "fp8_fake_quantize_blocks: f32 [R, C] in positive tiles, got {} {}", dtype_name(x.dtype()), x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1), tr = (R + tile_r - 1) / tile_r, tc = (C + tile_c - 1) / tile_c;
  check_vector(scales, Device::CPU, DType::F32, tr * tc, "fp8_fake_quantize_blocks (scales)");
  const float mx = fp8_max(format);
  const float* in = x.data<float>();
  Tensor y = Tensor::empty(x.shape());
  float* out = y.data<float>();
  float* sc = scales.data<float>();
  for (int64_t bi = 0; bi < tr; ++bi)
    for (int64_t bj = 0; bj < tc; ++bj) {
      const int64_t r0 = bi * tile_r, r1 = std::min(R, r0 + tile_r), c0 = bj * tile_c, c1 = std::min(C, c0 + tile_c);
      float a = 0.f;
      for (int64_t r = r0; r < r1; ++r) a = std::fmax(a, amax_of(in + r * C + c0, c1 - c0));
      const float s = fp8::pow2_floor(fp8::scale_from_amax(a, mx, 1.f)), inv = 1.f / s;
      sc[bi * tc + bj] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[r * C + c] = fp8_round(in[r * C + c] * s, format) * inv;
    }
  return y;
}

}  // namespace mt::ops::host
