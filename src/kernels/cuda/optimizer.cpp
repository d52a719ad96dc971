// The optimizer side of the CUDA backend (optimizer.h), and the gradient norm op of ops.def.
#include "kernels/cuda/optimizer.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/op_backends.h"

namespace mt::ops::gpu {
namespace {

using Ranges = std::vector<std::pair<int64_t, int64_t>>;
using cuda::bf16;
using cuda::f16;

cudaStream_t st() { return cuda::compute_stream(); }

// The non-empty [lo, hi) ranges of a flat fp32 buffer as the kernels' spans.
std::vector<cuda::GradSpan> spans_of(float* buf, const Ranges& ranges) {
  std::vector<cuda::GradSpan> spans;
  for (auto [lo, hi] : ranges)
    if (hi > lo) spans.push_back(cuda::GradSpan{buf + lo, hi - lo});
  return spans;
}

}  // namespace

// One pass over the merged ranges (adjacent parameters form one run).
double grad_norm_squared(const Tensor& grads, const Ranges& ranges) {
  check_vector(grads, Device::CUDA, DType::F32, grads.numel(), "grad_norm_squared");
  Ranges sorted(ranges);
  std::sort(sorted.begin(), sorted.end());
  Ranges runs;
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

bool unscale_and_check(float* grads, const Ranges& ranges, float inv_scale) {
  const std::vector<cuda::GradSpan> spans = spans_of(grads, ranges);
  Tensor flag = Tensor::zeros({1}, DType::I32, Device::CUDA);  // zeroed on the compute stream
  cuda::unscale_and_check(spans, inv_scale, flag.data<int32_t>(), st());
  // The one host read per step: the scaler decides here whether the optimizer runs.
  int32_t found = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&found, flag.data<int32_t>(), sizeof(found), cudaMemcpyDeviceToHost, st()));
  MT_CUDA_CHECK(cudaStreamSynchronize(st()));
  return found != 0;
}

void clip_grads(float* grads, int64_t n, double total_norm, double max_norm) {
  const double c = max_norm / (total_norm + 1e-6);
  if (c < 1.0) cuda::scale_inplace(grads, static_cast<float>(c), n, st());
}

struct AdamWState {
  std::vector<optim::ParamSpan> spans;
  float* m = nullptr;
  float* v = nullptr;
  double beta1, beta2, eps;
  DType half;
};

AdamW::AdamW(int64_t numel, std::vector<optim::ParamSpan> spans, double beta1, double beta2, double eps, DType half)
    : st_(new AdamWState{std::move(spans), nullptr, nullptr, beta1, beta2, eps, half}) {
  MT_CHECK(half == DType::BF16 || half == DType::F16, "AdamW: the compute copy is bf16 or fp16, not {}",
           dtype_name(half));
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st_->m), static_cast<size_t>(numel) * 4));
  MT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st_->v), static_cast<size_t>(numel) * 4));
  MT_CUDA_CHECK(cudaMemset(st_->m, 0, static_cast<size_t>(numel) * 4));
  MT_CUDA_CHECK(cudaMemset(st_->v, 0, static_cast<size_t>(numel) * 4));
}

AdamW::~AdamW() {
  cudaFree(st_->m);
  cudaFree(st_->v);
  delete st_;
}

float* AdamW::exp_avg() const { return st_->m; }
float* AdamW::exp_avg_sq() const { return st_->v; }

void AdamW::step(float* params, const float* grads, uint16_t* params_half, double lr, double wd) {
  ++step_;
  std::vector<cuda::AdamWTensor> ts;
  for (const auto& sp : st_->spans) {
    cuda::AdamWTensor t;
    t.param = params + sp.offset;
    t.grad = grads + sp.offset;
    t.exp_avg = st_->m + sp.offset;
    t.exp_avg_sq = st_->v + sp.offset;
    if (params_half && st_->half == DType::F16)
      t.param_f16 = reinterpret_cast<f16*>(params_half) + sp.offset;
    else if (params_half)
      t.param_bf16 = reinterpret_cast<bf16*>(params_half) + sp.offset;
    t.numel = sp.numel;
    t.weight_decay = sp.weight_decay;
    ts.push_back(t);
  }
  cuda::AdamWHyper h;
  h.lr = lr;
  h.weight_decay = wd;
  h.beta1 = st_->beta1;
  h.beta2 = st_->beta2;
  h.eps = st_->eps;
  h.step = step_;
  cuda::adamw_step(ts, h, st());
}

}  // namespace mt::ops::gpu
