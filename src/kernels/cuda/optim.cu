// Multi-tensor optimizer kernels over fp32 main params and grads: AdamW and SGD (each with an
// optional bf16 or fp16 copy of the updated params), the global grad norm, clipping, and the loss
// scaler's unscale-and-check. A launch carries a table of up to kMaxTensors tensors in its
// parameters; block b finds its tensor by the table's prefix of block counts, so one launch
// covers tensors of any size.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/common.cuh"

namespace mt::cuda {

namespace {

constexpr int kMaxTensors = 24;
constexpr int kThreads = 256;
constexpr int64_t kUpdateChunk = 4096;  // elements per block of an update
constexpr int64_t kNormChunk = 16384;   // elements per block (per partial sum)

// One launch's tensors of an elementwise update: params, grads, up to two state arrays, the
// compute copy, and one factor per tensor (AdamW's decay factor, SGD's weight decay).
struct UpdateBatch {
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* s1[kMaxTensors];  // AdamW's exp_avg, SGD's momentum buffer (or null)
  float* s2[kMaxTensors];  // AdamW's exp_avg_sq
  void* out[kMaxTensors];  // bf16 or fp16 compute copies (the kernel's TO), or null
  int64_t n[kMaxTensors];
  int64_t block_start[kMaxTensors + 1];
  float f[kMaxTensors];
  int count;
};

struct AdamScalars {
  float step_size, bc2_sqrt, b1, omb1, b2, omb2, eps, grad_scale;
};

__device__ __forceinline__ int find_tensor(const int64_t* block_start, int count, int64_t b) {
  int t = 0;
  while (t + 1 < count && block_start[t + 1] <= b) ++t;
  return t;
}

// The element range of block b of an update launch, and its tensor.
struct UpdateBlock {
  int t;
  int64_t begin, end;
};
__device__ __forceinline__ UpdateBlock update_block(const UpdateBatch& batch) {
  const int64_t b = blockIdx.x;
  const int t = find_tensor(batch.block_start, batch.count, b);
  const int64_t begin = (b - batch.block_start[t]) * kUpdateChunk;
  return {t, begin, min(batch.n[t], begin + kUpdateChunk)};
}

// The CPU's expression, operation for operation, with explicit round-to-nearest intrinsics so
// the compiler cannot contract into FMAs: the result equals kernels/cpu/optimizer.cpp bit for bit.
// TO: the compute copy's type (bf16 or fp16); the fp32 update is the same either way.
template <typename TO>
__global__ void adamw_kernel(const __grid_constant__ UpdateBatch batch, AdamScalars c) {
  const UpdateBlock k = update_block(batch);
  float* __restrict__ p = batch.p[k.t];
  const float* __restrict__ g = batch.g[k.t];
  float* __restrict__ m = batch.s1[k.t];
  float* __restrict__ v = batch.s2[k.t];
  TO* __restrict__ out = static_cast<TO*>(batch.out[k.t]);
  const float df = batch.f[k.t];
  for (int64_t i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
    const float gi = __fmul_rn(g[i], c.grad_scale);  // the clipped grad (x 1 is exact)
    const float pi = __fmul_rn(p[i], df);
    const float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.omb1, gi));
    const float vi = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(c.omb2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
    const float np = __fsub_rn(pi, __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
    p[i] = np;
    if (out) out[i] = from_f<TO>(np);
  }
}

// SGD as the CPU's, operation for operation: d = g (+ wd*p), b = first ? d : b*mom + d, p += -lr*b.
template <typename TO>
__global__ void sgd_kernel(const __grid_constant__ UpdateBatch batch, float neg_lr, float mom, bool first, float gs) {
  const UpdateBlock k = update_block(batch);
  float* __restrict__ p = batch.p[k.t];
  const float* __restrict__ g = batch.g[k.t];
  float* __restrict__ buf = batch.s1[k.t];
  TO* __restrict__ out = static_cast<TO*>(batch.out[k.t]);
  const float wd = batch.f[k.t];
  for (int64_t i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
    float d = __fmul_rn(g[i], gs);  // the clipped grad (x 1 is exact)
    if (wd != 0.0f) d = __fadd_rn(d, __fmul_rn(wd, p[i]));
    if (buf) {
      d = first ? d : __fadd_rn(__fmul_rn(buf[i], mom), d);
      buf[i] = d;
    }
    const float np = __fadd_rn(p[i], __fmul_rn(neg_lr, d));
    p[i] = np;
    if (out) out[i] = from_f<TO>(np);
  }
}

struct NormBatch {
  const float* x[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t block_start[kMaxTensors + 1];
  int count;
};

__global__ void sumsq_kernel(const __grid_constant__ NormBatch batch, double* __restrict__ partial,
                             int64_t partial_base) {
  __shared__ double sh[32];
  const int64_t b = blockIdx.x;
  const int t = find_tensor(batch.block_start, batch.count, b);
  const int64_t begin = (b - batch.block_start[t]) * kNormChunk;
  const int64_t end = min(batch.n[t], begin + kNormChunk);
  const float* __restrict__ x = batch.x[t];
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[partial_base + b] = acc;
}

__global__ void sum_partials_kernel(const double* __restrict__ partial, int64_t n, double* __restrict__ out) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) *out = acc;
}

__global__ void clip_kernel(const __grid_constant__ NormBatch batch, const double* __restrict__ norm_sq,
                            double max_norm) {
  const double coeff = max_norm / (sqrt(*norm_sq) + 1.0e-6);
  if (!(coeff < 1.0)) return;  // as Megatron: also leaves grads alone when the norm is NaN
  const float c = static_cast<float>(coeff);
  const int64_t b = blockIdx.x;
  const int t = find_tensor(batch.block_start, batch.count, b);
  const int64_t begin = (b - batch.block_start[t]) * kNormChunk;
  const int64_t end = min(batch.n[t], begin + kNormChunk);
  float* x = const_cast<float*>(batch.x[t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] *= c;
}

// grads *= inv_scale; a non-finite product sets *found (every writer stores the same 1, so the
// unordered stores do not make the result depend on timing).
__global__ void unscale_check_kernel(const __grid_constant__ NormBatch batch, float inv_scale,
                                     int32_t* __restrict__ found) {
  const int64_t b = blockIdx.x;
  const int t = find_tensor(batch.block_start, batch.count, b);
  const int64_t begin = (b - batch.block_start[t]) * kNormChunk;
  const int64_t end = min(batch.n[t], begin + kNormChunk);
  float* x = const_cast<float*>(batch.x[t]);
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = __fmul_rn(x[i], inv_scale);
    bad |= !isfinite(g);
    x[i] = g;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
}

// Splits `spans` into batches of at most kMaxTensors non-empty tensors and calls f(batch, blocks).
template <typename F>
void for_norm_batches(const std::vector<GradSpan>& spans, F f) {
  NormBatch nb{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (nb.count == 0) return;
    nb.block_start[nb.count] = blocks;
    f(nb, blocks);
    nb = NormBatch{};
    blocks = 0;
  };
  for (const GradSpan& sp : spans) {
    if (sp.numel <= 0) continue;
    nb.x[nb.count] = sp.data;
    nb.n[nb.count] = sp.numel;
    nb.block_start[nb.count] = blocks;
    blocks += ceil_div(sp.numel, kNormChunk);
    if (++nb.count == kMaxTensors) flush();
  }
  flush();
}

// Splits the non-empty tensors into launches of at most kMaxTensors: fill(batch, i, tensor) sets
// slot i's pointers and factor, launch(batch, blocks) runs one launch.
template <typename T, typename Fill, typename Launch>
void for_update_batches(const std::vector<T>& tensors, Fill fill, Launch launch) {
  UpdateBatch batch{};
  int64_t blocks = 0;
  auto flush = [&] {
    if (batch.count == 0) return;
    batch.block_start[batch.count] = blocks;
    launch(batch, static_cast<unsigned>(blocks));
    MT_CUDA_LAUNCH_CHECK();
    batch = UpdateBatch{};
    blocks = 0;
  };
  for (const T& t : tensors) {
    if (t.numel <= 0) continue;
    MT_CHECK(t.param && t.grad, "optimizer step: null pointer in a tensor of {} elements", t.numel);
    const int i = batch.count;
    fill(batch, i, t);
    batch.p[i] = t.param;
    batch.g[i] = t.grad;
    batch.out[i] = t.param_f16 ? static_cast<void*>(t.param_f16) : static_cast<void*>(t.param_bf16);
    batch.n[i] = t.numel;
    batch.block_start[i] = blocks;
    blocks += ceil_div(t.numel, kUpdateChunk);
    if (++batch.count == kMaxTensors) flush();
  }
  flush();
}

// Whether a call writes fp16 compute copies (otherwise bf16 ones, or none): one type per call, as
// a model is all bf16 or all fp16.
template <typename T>
bool f16_copies(const std::vector<T>& tensors, const char* what) {
  bool f16_out = false, bf16_out = false;
  for (const T& t : tensors) f16_out |= t.param_f16 != nullptr, bf16_out |= t.param_bf16 != nullptr;
  MT_CHECK(!(f16_out && bf16_out), "{}: a call writes bf16 or fp16 compute copies, not both", what);
  return f16_out;
}

}  // namespace

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, cudaStream_t s) {
  // Per-step scalars in double, rounded once to fp32, exactly as kernels/cpu/optimizer.cpp.
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  AdamScalars c{};
  c.step_size = static_cast<float>(h.lr / bc1);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.b1 = static_cast<float>(h.beta1);
  c.omb1 = static_cast<float>(1.0 - h.beta1);
  c.b2 = static_cast<float>(h.beta2);
  c.omb2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.grad_scale = h.grad_scale;
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const bool f16_out = f16_copies(tensors, "adamw_step");
  for_update_batches(
      tensors,
      [&](UpdateBatch& b, int i, const AdamWTensor& t) {
        MT_CHECK(t.exp_avg && t.exp_avg_sq, "adamw_step: no moments for a tensor of {} elements", t.numel);
        b.s1[i] = t.exp_avg;
        b.s2[i] = t.exp_avg_sq;
        b.f[i] = t.weight_decay ? decay : 1.0f;
      },
      [&](const UpdateBatch& b, unsigned blocks) {
        if (f16_out)
          adamw_kernel<f16><<<blocks, kThreads, 0, s>>>(b, c);
        else
          adamw_kernel<bf16><<<blocks, kThreads, 0, s>>>(b, c);
      });
}

void sgd_step(const std::vector<SGDTensor>& tensors, const SGDHyper& h, cudaStream_t s) {
  const bool f16_out = f16_copies(tensors, "sgd_step");
  for_update_batches(
      tensors,
      [&](UpdateBatch& b, int i, const SGDTensor& t) {
        b.s1[i] = t.momentum_buffer;
        b.s2[i] = nullptr;
        b.f[i] = t.weight_decay ? h.weight_decay : 0.0f;
      },
      [&](const UpdateBatch& b, unsigned blocks) {
        if (f16_out)
          sgd_kernel<f16><<<blocks, kThreads, 0, s>>>(b, -h.lr, h.momentum, h.first, h.grad_scale);
        else
          sgd_kernel<bf16><<<blocks, kThreads, 0, s>>>(b, -h.lr, h.momentum, h.first, h.grad_scale);
      });
}

void grad_norm_squared(const std::vector<GradSpan>& spans, double* out, cudaStream_t s) {
  int64_t total_blocks = 0;
  for (const GradSpan& sp : spans)
    if (sp.numel > 0) total_blocks += ceil_div(sp.numel, kNormChunk);
  if (total_blocks == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), s));
    return;
  }
  Scratch partial(static_cast<size_t>(total_blocks) * sizeof(double), s);
  int64_t base = 0;
  for_norm_batches(spans, [&](const NormBatch& nb, int64_t blocks) {
    sumsq_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(nb, partial.as<double>(), base);
    MT_CUDA_LAUNCH_CHECK();
    base += blocks;
  });
  sum_partials_kernel<<<1, 1024, 0, s>>>(partial.as<double>(), total_blocks, out);
  MT_CUDA_LAUNCH_CHECK();
}

double grad_norm_squared_host(const std::vector<GradSpan>& spans, cudaStream_t s) {
  Scratch d(sizeof(double), s);
  grad_norm_squared(spans, d.as<double>(), s);
  double h = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&h, d.as<double>(), sizeof(double), cudaMemcpyDeviceToHost, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
  return h;
}

void clip_grads(const std::vector<GradSpan>& spans, const double* norm_sq, double max_norm, cudaStream_t s) {
  for_norm_batches(spans, [&](const NormBatch& nb, int64_t blocks) {
    clip_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(nb, norm_sq, max_norm);
    MT_CUDA_LAUNCH_CHECK();
  });
}

void unscale_and_check(const std::vector<GradSpan>& spans, float inv_scale, int32_t* found_inf, cudaStream_t s) {
  for_norm_batches(spans, [&](const NormBatch& nb, int64_t blocks) {
    unscale_check_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(nb, inv_scale, found_inf);
    MT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace mt::cuda
