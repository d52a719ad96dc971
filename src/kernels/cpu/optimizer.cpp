// The optimizer ops' CPU reference (ops.def, "Optimizer side"): clipping, the fp16 unscale and
// check, and the AdamW and SGD updates, as optim/ has always stepped on the CPU (the same fp32
// expressions in the same order, so CPU runs keep their bits).
#include <cmath>
#include <initializer_list>

#include "core/dtype.h"
#include "kernels/cpu/threads.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {
namespace {

void check_ranges(const Tensor& grads, const FlatRanges& ranges, const char* what) {
  check_vector(grads, Device::CPU, DType::F32, grads.numel(), what);
  for (auto [lo, hi] : ranges)
    MT_CHECK(0 <= lo && lo <= hi && hi <= grads.numel(), "{}: range [{}, {}) outside a buffer of {}", what, lo, hi,
             grads.numel());
}

void check_segments(const std::vector<DecaySegment>& segments, int64_t n, const char* what) {
  for (const DecaySegment& s : segments)
    MT_CHECK(0 <= s.begin && s.begin <= s.end && s.end <= n, "{}: segment [{}, {}) outside a buffer of {}", what,
             s.begin, s.end, n);
}

// Calls body(write) with write(i, value) storing element i of the compute copy: nothing without
// a copy, the value rounded to half in fp32 storage (the CPU's emulation of a half copy), or its
// bf16/fp16 bits. One instantiation of the update loop per kind keeps the branch out of it.
template <typename Body>
void with_copy_writer(const HalfCopy& copy, int64_t n, const char* what, Body&& body) {
  if (!copy.defined()) return body([](int64_t, float) {});
  MT_CHECK(copy.half == DType::BF16 || copy.half == DType::F16, "{}: the compute copy is bf16 or fp16, not {}", what,
           dtype_name(copy.half));
  MT_CHECK(copy.out.device() == Device::CPU && copy.out.numel() == n &&
               (copy.out.dtype() == DType::F32 || copy.out.dtype() == copy.half),
           "{}: the compute copy must be a CPU tensor of {} elements, fp32 or {}, got {} {}", what, n,
           dtype_name(copy.half), dtype_name(copy.out.dtype()), copy.out.shape_str());
  const bool f16 = copy.half == DType::F16;
  if (copy.out.dtype() == DType::F32) {
    float* d = copy.out.data<float>();
    if (f16) return body([d](int64_t i, float v) { d[i] = round_f16(v); });
    return body([d](int64_t i, float v) { d[i] = round_bf16(v); });
  }
  uint16_t* d = copy.out.data<uint16_t>();
  if (f16) return body([d](int64_t i, float v) { d[i] = f32_to_f16(v); });
  return body([d](int64_t i, float v) { d[i] = f32_to_bf16(v); });
}

// f(i, weight_decay) for every element of the segments, on the threads (each segment split
// statically: an update's results do not depend on the split).
template <typename F>
void for_segments(const std::vector<DecaySegment>& segments, int64_t n, F&& f) {
#pragma omp parallel if (n > cpu::kParallelThreshold)
  for (const DecaySegment& seg : segments) {
#pragma omp for schedule(static) nowait
    for (int64_t i = seg.begin; i < seg.end; ++i) f(i, seg.weight_decay);
  }
}

}  // namespace

void clip_grads(Tensor& grads, const FlatRanges& ranges, double total_norm, double max_norm) {
  check_ranges(grads, ranges, "clip_grads");
  // A NaN norm leaves the grads alone (the caller detects NaN and skips the step).
  const float c = clip_coefficient(total_norm, max_norm);
  if (c == 1.f) return;
  float* g = grads.data<float>();
  for (const auto& r : ranges) {
    // Plain variables, not structured bindings: clang's OpenMP cannot capture bindings.
    const int64_t lo = r.first, hi = r.second;
#pragma omp parallel for schedule(static) if (hi - lo > cpu::kParallelThreshold)
    for (int64_t i = lo; i < hi; ++i) g[i] *= c;
  }
}

bool unscale_and_check(Tensor& grads, const FlatRanges& ranges, float inv_scale) {
  check_ranges(grads, ranges, "unscale_and_check");
  float* g = grads.data<float>();
  int found = 0;
  for (const auto& r : ranges) {
    const int64_t lo = r.first, hi = r.second;  // not bindings: see clip_grads
#pragma omp parallel for schedule(static) reduction(| : found) if (hi - lo > cpu::kParallelThreshold)
    for (int64_t i = lo; i < hi; ++i) {
      // Scaling by a positive finite factor keeps inf/nan non-finite, so checking the result
      // catches bad inputs and also an overflow caused by unscaling with a scale below 1.
      const float x = g[i] * inv_scale;
      found |= !std::isfinite(x);
      g[i] = x;
    }
  }
  return found != 0;
}

void adamw_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                const std::vector<DecaySegment>& segments, const AdamWStep& h, const HalfCopy& copy) {
  const int64_t n = params.numel();
  for (const Tensor* t : std::initializer_list<const Tensor*>{&params, &grads, &exp_avg, &exp_avg_sq})
    check_vector(*t, Device::CPU, DType::F32, n, "adamw_step");
  check_segments(segments, n, "adamw_step");
  // Per-step scalars in double, as torch computes them on the host; the elementwise math is
  // fp32 with these rounded once, as in torch's single-tensor path. lr and weight decay enter as
  // fp32 values (ops.def).
  const double lr = static_cast<float>(h.lr), wd = static_cast<float>(h.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float decay_factor = static_cast<float>(1.0 - lr * wd);
  const float b1 = static_cast<float>(h.beta1), omb1 = static_cast<float>(1.0 - h.beta1);
  const float b2 = static_cast<float>(h.beta2), omb2 = static_cast<float>(1.0 - h.beta2);
  const float eps = static_cast<float>(h.eps);
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const float gs = h.grad_scale;
  with_copy_writer(copy, n, "adamw_step", [&](auto write) {
    for_segments(segments, n, [&](int64_t i, bool decay) {
      // torch skips the multiply when weight_decay == 0; multiplying by exactly 1 is the same.
      const float gi = g[i] * gs;  // the clipped grad (x 1 is exact)
      const float pi = p[i] * (decay ? decay_factor : 1.0f);
      const float mi = b1 * m[i] + omb1 * gi;
      const float vi = b2 * v[i] + omb2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      const float np = pi - step_size * mi / denom;
      p[i] = np;
      write(i, np);
    });
  });
}

void sgd_step(Tensor& params, const Tensor& grads, Tensor* momentum_buffer, const std::vector<DecaySegment>& segments,
              const SGDStep& h, const HalfCopy& copy) {
  const int64_t n = params.numel();
  check_vector(params, Device::CPU, DType::F32, n, "sgd_step");
  check_vector(grads, Device::CPU, DType::F32, n, "sgd_step");
  if (momentum_buffer) check_vector(*momentum_buffer, Device::CPU, DType::F32, n, "sgd_step (momentum buffer)");
  check_segments(segments, n, "sgd_step");
  const bool first = h.first;
  const float mom = static_cast<float>(h.momentum);
  const float neg_lr = -static_cast<float>(h.lr);
  const float weight_decay = static_cast<float>(h.weight_decay);
  float* p = params.data<float>();
  const float* g = grads.data<float>();
  float* buf = momentum_buffer ? momentum_buffer->data<float>() : nullptr;
  const float gs = h.grad_scale;
  with_copy_writer(copy, n, "sgd_step", [&](auto write) {
    for_segments(segments, n, [&](int64_t i, bool decay) {
      const float wd = decay ? weight_decay : 0.0f;
      float d_p = g[i] * gs;  // the clipped grad (x 1 is exact)
      if (wd != 0.0f) d_p = d_p + wd * p[i];
      if (buf) {
        buf[i] = first ? d_p : buf[i] * mom + d_p;
        d_p = buf[i];
      }
      const float np = p[i] + neg_lr * d_p;
      p[i] = np;
      write(i, np);
    });
  });
}

}  // namespace mt::ops::host
