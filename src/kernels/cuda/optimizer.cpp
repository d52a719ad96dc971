// The optimizer ops of ops.def on the GPU: the gradient norm, clipping, the fp16 unscale and
// check, and the AdamW and SGD updates over a flat buffer's segments (the multi-tensor kernels of
// optim.cu, one table entry per segment), writing the compute copy in the same pass.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {
namespace {

using cuda::bf16;
using cuda::f16;

cudaStream_t st() { return cuda::compute_stream(); }

void check_ranges(const Tensor& grads, const FlatRanges& ranges, const char* what) {
  check_vector(grads, Device::CUDA, DType::F32, grads.numel(), what);
  for (auto [lo, hi] : ranges)
    MT_CHECK(0 <= lo && lo <= hi && hi <= grads.numel(), "{}: range [{}, {}) outside a buffer of {}", what, lo, hi,
             grads.numel());
}

// The non-empty [lo, hi) ranges of a flat fp32 buffer as the kernels' spans.
std::vector<cuda::GradSpan> spans_of(float* buf, const FlatRanges& ranges) {
  std::vector<cuda::GradSpan> spans;
  for (auto [lo, hi] : ranges)
    if (hi > lo) spans.push_back(cuda::GradSpan{buf + lo, hi - lo});
  return spans;
}

// The segments of an update as the kernels' tensor table (T: cuda::AdamWTensor or SGDTensor),
// each with its pointers at the segment's start; `with_state` sets the state pointers.
template <typename T, typename F>
std::vector<T> update_tensors(Tensor& params, const Tensor& grads, const std::vector<DecaySegment>& segments,
                              const HalfCopy& copy, const char* what, F with_state) {
  const int64_t n = params.numel();
  check_vector(params, Device::CUDA, DType::F32, n, what);
  check_vector(grads, Device::CUDA, DType::F32, n, what);
  if (copy.defined())
    MT_CHECK((copy.half == DType::BF16 || copy.half == DType::F16) && copy.out.dtype() == copy.half &&
                 copy.out.device() == Device::CUDA && copy.out.numel() == n,
             "{}: the compute copy must be a GPU {} tensor of {} elements, got {} {}", what, dtype_name(copy.half), n,
             dtype_name(copy.out.dtype()), copy.out.shape_str());
  std::vector<T> ts;
  for (const DecaySegment& s : segments) {
    MT_CHECK(0 <= s.begin && s.begin <= s.end && s.end <= n, "{}: segment [{}, {}) outside a buffer of {}", what,
             s.begin, s.end, n);
    T t;
    t.param = params.data<float>() + s.begin;
    t.grad = grads.data<float>() + s.begin;
    if (copy.defined() && copy.half == DType::F16) t.param_f16 = copy.out.data<f16>() + s.begin;
    if (copy.defined() && copy.half == DType::BF16) t.param_bf16 = copy.out.data<bf16>() + s.begin;
    t.numel = s.end - s.begin;
    t.weight_decay = s.weight_decay;
    with_state(t, s.begin);
    ts.push_back(t);
  }
  return ts;
}

}  // namespace

// One pass over the merged ranges (adjacent parameters form one run).
double grad_norm_squared(const Tensor& grads, const FlatRanges& ranges) {
  check_ranges(grads, ranges, "grad_norm_squared");
  FlatRanges sorted(ranges);
  std::sort(sorted.begin(), sorted.end());
  FlatRanges runs;
  for (auto r : sorted) {
    if (!runs.empty() && runs.back().second >= r.first)
      runs.back().second = std::max(runs.back().second, r.second);
    else
      runs.push_back(r);
  }
  const std::vector<cuda::GradSpan> spans = spans_of(grads.data<float>(), runs);
  if (spans.empty()) return 0.0;
  return cuda::grad_norm_squared_host(spans, st());
}

void clip_grads(Tensor& grads, const FlatRanges& ranges, double total_norm, double max_norm) {
  check_ranges(grads, ranges, "clip_grads");
  const float c = clip_coefficient(total_norm, max_norm);
  if (c == 1.f) return;  // as Megatron: also leaves the grads alone when the norm is NaN
  for (auto [lo, hi] : ranges) cuda::scale_inplace(grads.data<float>() + lo, c, hi - lo, st());
}

bool unscale_and_check(Tensor& grads, const FlatRanges& ranges, float inv_scale) {
  check_ranges(grads, ranges, "unscale_and_check");
  const std::vector<cuda::GradSpan> spans = spans_of(grads.data<float>(), ranges);
  Tensor flag = Tensor::zeros({1}, DType::I32, Device::CUDA);  // zeroed on the compute stream
  cuda::unscale_and_check(spans, inv_scale, flag.data<int32_t>(), st());
  // The one host read per step: the scaler decides here whether the optimizer runs.
  int32_t found = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&found, flag.data<int32_t>(), sizeof(found), cudaMemcpyDeviceToHost, st()));
  MT_CUDA_CHECK(cudaStreamSynchronize(st()));
  return found != 0;
}

void adamw_step(Tensor& params, const Tensor& grads, Tensor& exp_avg, Tensor& exp_avg_sq,
                const std::vector<DecaySegment>& segments, const AdamWStep& h, const HalfCopy& copy) {
  check_vector(exp_avg, Device::CUDA, DType::F32, params.numel(), "adamw_step (exp_avg)");
  check_vector(exp_avg_sq, Device::CUDA, DType::F32, params.numel(), "adamw_step (exp_avg_sq)");
  const auto ts = update_tensors<cuda::AdamWTensor>(params, grads, segments, copy, "adamw_step",
                                                    [&](cuda::AdamWTensor& t, int64_t at) {
                                                      t.exp_avg = exp_avg.data<float>() + at;
                                                      t.exp_avg_sq = exp_avg_sq.data<float>() + at;
                                                    });
  cuda::AdamWHyper c;
  c.lr = h.lr;
  c.weight_decay = h.weight_decay;
  // The betas and eps as fp32 values, as GPU runs have always taken them (ops.def).
  c.beta1 = static_cast<float>(h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.step = h.step;
  c.grad_scale = h.grad_scale;
  cuda::adamw_step(ts, c, st());
}

void sgd_step(Tensor& params, const Tensor& grads, Tensor* momentum_buffer, const std::vector<DecaySegment>& segments,
              const SGDStep& h, const HalfCopy& copy) {
  if (momentum_buffer)
    check_vector(*momentum_buffer, Device::CUDA, DType::F32, params.numel(), "sgd_step (momentum buffer)");
  const auto ts = update_tensors<cuda::SGDTensor>(params, grads, segments, copy, "sgd_step",
                                                  [&](cuda::SGDTensor& t, int64_t at) {
                                                    if (momentum_buffer) t.momentum_buffer = momentum_buffer->data<float>() + at;
                                                  });
  cuda::SGDHyper c;
  c.lr = static_cast<float>(h.lr);
  c.weight_decay = static_cast<float>(h.weight_decay);
  c.momentum = static_cast<float>(h.momentum);
  c.first = h.first;
  c.grad_scale = h.grad_scale;
  cuda::sgd_step(ts, c, st());
}

}  // namespace mt::ops::gpu
