// Rotary position embedding, rotate-half form: channel i of the rotated part pairs with
// channel i + rot_dim/2, both turned by angle s * inv_freq[i]. Channels past rot_dim
// (rotary_percent < 1) pass through untouched. Backward rotates by the opposite angle.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

template <typename T>
void rope_tables_impl(int64_t seq, int64_t rot_dim, double base, T* cos_out, T* sin_out) {
  MT_CHECK(rot_dim % 2 == 0 && rot_dim >= 0, "rotary dim must be even (got {})", rot_dim);
  const int64_t half = rot_dim / 2;
  // Angles in double: positions times frequencies reach ~1e4 rad at long sequences, where
  // fp32 angle arithmetic would lose several bits before the cos/sin.
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
      const double a = static_cast<double>(s) * inv_freq;
      cos_out[s * half + i] = static_cast<T>(std::cos(a));
      sin_out[s * half + i] = static_cast<T>(std::sin(a));
    }
}

// sign = +1 rotates forward, -1 applies the inverse (transpose) rotation. Tables hold S rows,
// or B * S (sample after sample) where positions differ between samples (packed documents).
template <typename T>
void rope_apply(T* x, const T* cos, const T* sin, int64_t B, int64_t H, int64_t S, int64_t D, int64_t rot_dim,
                T sign, bool per_sample) {
  MT_CHECK(rot_dim % 2 == 0 && rot_dim <= D, "rotary dim {} must be even and <= head dim {}", rot_dim, D);
  const int64_t half = rot_dim / 2;
  const int64_t heads = B * H;
#pragma omp parallel for collapse(2) schedule(static) if (heads * S * D > 65536)
  for (int64_t bh = 0; bh < heads; ++bh)
    for (int64_t s = 0; s < S; ++s) {
      T* row = x + (bh * S + s) * D;
      const int64_t t = per_sample ? bh / H * S + s : s;
      const T* c = cos + t * half;
      const T* sn = sin + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const T x1 = row[i], x2 = row[i + half], si = sign * sn[i];
        row[i] = x1 * c[i] - x2 * si;
        row[i + half] = x2 * c[i] + x1 * si;
      }
    }
}

}  // namespace

void rope_tables(int64_t seq, int64_t rot_dim, double base, float* cos_out, float* sin_out) {
  rope_tables_impl(seq, rot_dim, base, cos_out, sin_out);
}
void rope_tables(int64_t seq, int64_t rot_dim, double base, double* cos_out, double* sin_out) {
  rope_tables_impl(seq, rot_dim, base, cos_out, sin_out);
}
void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                  int64_t rot_dim, bool per_sample) {
  rope_apply(x, cos, sin, B, H, S, D, rot_dim, 1.f, per_sample);
}
void rope_forward(double* x, const double* cos, const double* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                  int64_t rot_dim, bool per_sample) {
  rope_apply(x, cos, sin, B, H, S, D, rot_dim, 1.0, per_sample);
}
void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                   int64_t rot_dim, bool per_sample) {
  rope_apply(dx, cos, sin, B, H, S, D, rot_dim, -1.f, per_sample);
}
void rope_backward(double* dx, const double* cos, const double* sin, int64_t B, int64_t H, int64_t S, int64_t D,
                   int64_t rot_dim, bool per_sample) {
  rope_apply(dx, cos, sin, B, H, S, D, rot_dim, -1.0, per_sample);
}

}  // namespace mt::cpu
