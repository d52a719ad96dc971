// FP8 ops of ops.def on the CPU: the exact emulation the GPU's kernels are checked against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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
      const float s = fp8::block_scale(a, mx), inv = 1.f / s;
      sc[bi * tc + bj] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[r * C + c] = fp8_round(in[r * C + c] * s, format) * inv;
    }
  return y;
}

}  // namespace mt::ops::host

namespace mt::ops::host {

void fp8_cast_transpose(const Tensor& x, const Tensor& scale, Fp8Format format, Tensor& q, Tensor* qt, Tensor& amax,
                        Tensor& saturated) {
  MT_CHECK(x.dtype() == DType::F32 && x.ndim() == 2, "fp8_cast_transpose: f32 [R, C], got {} {}",
           dtype_name(x.dtype()), x.shape_str());
  const int64_t R = x.dim(0), C = x.dim(1);
  if (q.defined()) check_vector(q, Device::CPU, DType::U8, R * C, "fp8_cast_transpose (q)");
  if (qt) check_vector(*qt, Device::CPU, DType::U8, R * C, "fp8_cast_transpose (qt)");
  check_vector(scale, Device::CPU, DType::F32, 1, "fp8_cast_transpose (scale)");
  check_vector(amax, Device::CPU, DType::F32, 1, "fp8_cast_transpose (amax)");
  check_vector(saturated, Device::CPU, DType::I64, 1, "fp8_cast_transpose (saturated)");
  const float s = *scale.data<float>(), mx = fp8_max(format);
  const float* in = x.data<float>();
  uint8_t* out = q.defined() ? q.data<uint8_t>() : nullptr;
  float a = *amax.data<float>();
  int64_t clipped = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float v = in[r * C + c];
      a = std::fmax(a, std::fabs(v));
      clipped += std::fabs(v * s) > mx;
      const uint8_t code = fp8_encode(v * s, format);
      if (out) out[r * C + c] = code;
      if (qt) qt->data<uint8_t>()[c * R + r] = code;
    }
  *amax.data<float>() = a;
  *saturated.data<int64_t>() += clipped;
}

// The fused casts' references: the unfused pair.
void swiglu_forward_fp8(const Tensor& h, const Tensor& scale, Fp8Format format, Tensor& q, Tensor* qt, Tensor& amax,
                        Tensor& saturated) {
  fp8_cast_transpose(swiglu_forward(h, nullptr), scale, format, q, qt, amax, saturated);
}

void swiglu_backward_fp8(const Tensor& dy, const Tensor& h, const Tensor& scale, Fp8Format format, Tensor& q,
                         Tensor* qt, Tensor& amax, Tensor& saturated) {
  fp8_cast_transpose(swiglu_backward(dy, h, nullptr), scale, format, q, qt, amax, saturated);
}

void fp8_cast_transpose_current(const Tensor& x, const Tensor& amax, Fp8Format format, Tensor& scale, Tensor& used,
                                Tensor& used_inv, Tensor& q, Tensor* qt, Tensor& saturated) {
  fp8_current_scale(amax, scale, fp8_max(format));
  Tensor ignored = Tensor::zeros({1});  // the cast's own amax: x's, known already
  fp8_cast_transpose(x, scale, format, q, qt, ignored, saturated);
  fp8_snapshot_scale(scale, used, used_inv);
}

void swiglu_backward_amax(const Tensor& dy, const Tensor& h, Tensor& amax) { swiglu_backward(dy, h, &amax); }

Tensor fp8_gemm(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b, Fp8Format b_format,
                const Tensor& b_scale_inv, DType out_dtype) {
  MT_CHECK(out_dtype == DType::F32, "fp8_gemm: the CPU writes f32, asked for {}", dtype_name(out_dtype));
  MT_CHECK(a.ndim() == 2 && b.ndim() == 2, "fp8_gemm: [M, K] x [N, K], got {} and {}", a.shape_str(), b.shape_str());
  Tensor d = Tensor::empty({a.dim(0), b.dim(0)});
  fp8_gemm_into(a, a_format, a_scale_inv, b, b_format, b_scale_inv, nullptr, d, false);
  return d;
}

void fp8_snapshot_scale(const Tensor& scale, Tensor& used, Tensor& used_inv) {
  check_scalar(scale, DType::F32, "fp8_snapshot_scale (scale)");
  check_scalar(used, DType::F32, "fp8_snapshot_scale (used)");
  check_scalar(used_inv, DType::F32, "fp8_snapshot_scale (used_inv)");
  const float s = *scale.data<float>();
  *used.data<float>() = s;
  *used_inv.data<float>() = 1.f / s;
}

void fp8_gemm_into(const Tensor& a, Fp8Format a_format, const Tensor& a_scale_inv, const Tensor& b,
                   Fp8Format b_format, const Tensor& b_scale_inv, const Tensor* c, Tensor& d, bool /*fast_accum*/) {
  MT_CHECK(a.dtype() == DType::U8 && b.dtype() == DType::U8 && a.ndim() == 2 && b.ndim() == 2 && a.dim(1) == b.dim(1),
           "fp8_gemm: U8 [M, K] x U8 [N, K], got {} {} and {} {}", dtype_name(a.dtype()), a.shape_str(),
           dtype_name(b.dtype()), b.shape_str());
  const int64_t M = a.dim(0), N = b.dim(0), K = a.dim(1);
  check_vector(d, Device::CPU, DType::F32, M * N, "fp8_gemm_into (d)");
  if (c) check_vector(*c, Device::CPU, DType::F32, M * N, "fp8_gemm_into (c)");
  const float sa = *a_scale_inv.data<float>(), sb = *b_scale_inv.data<float>();
  std::vector<float> av(static_cast<size_t>(M * K)), bv(static_cast<size_t>(N * K));
  for (int64_t i = 0; i < M * K; ++i) av[static_cast<size_t>(i)] = fp8_decode(a.data<uint8_t>()[i], a_format);
  for (int64_t i = 0; i < N * K; ++i) bv[static_cast<size_t>(i)] = fp8_decode(b.data<uint8_t>()[i], b_format);
  const float* add = c ? c->data<float>() : nullptr;  // read before the write: c may be d
  float* out = d.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.f;  // products of two FP8 values are exact in fp32; the sum rounds as any fp32 GEMM
      for (int64_t k = 0; k < K; ++k) acc += av[static_cast<size_t>(m * K + k)] * bv[static_cast<size_t>(n * K + k)];
      out[m * N + n] = acc * (sa * sb) + (add ? add[m * N + n] : 0.f);
    }
}

}  // namespace mt::ops::host
