// Tensor-level CUDA ops (see dispatch.h): shape bookkeeping and output allocation around the
// kernels of ops_cuda.h and layout.h, all on one compute stream.
#include "kernels/cuda/dispatch.h"

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/ops_cuda.h"

namespace mt::ops::gpu {
namespace {

struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cuda::CudaAllocator* alloc = nullptr;
  std::unique_ptr<cuda::Gemm> gemm;
};

// The process's GPU context, like a device handle: created once by init().
Context& ctx() {
  static Context c;
  return c;
}
cudaStream_t st() { return ctx().stream; }
cuda::Gemm& gemm() {
  MT_CHECK(ctx().gemm != nullptr, "CUDA backend used before ops::gpu::init()");
  return *ctx().gemm;
}

using bf16 = cuda::bf16;
bf16* b(const Tensor& t) {
  MT_CHECK(t.dtype() == DType::BF16 && t.device() == Device::CUDA, "expected a CUDA bf16 tensor, got {} {}",
           dtype_name(t.dtype()), t.shape_str());
  return t.data<bf16>();
}
float* f(const Tensor& t) {
  MT_CHECK(t.dtype() == DType::F32 && t.device() == Device::CUDA, "expected a CUDA f32 tensor, got {} {}",
           dtype_name(t.dtype()), t.shape_str());
  return t.data<float>();
}
Tensor act(const Shape& s) { return Tensor::empty(s, DType::BF16, Device::CUDA); }
Tensor stat(const Shape& s) { return Tensor::empty(s, DType::F32, Device::CUDA); }

}  // namespace

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void init(int device) {
  Context& c = ctx();
  if (c.gemm) return;
  if (!available()) fail("--device cuda: no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)");
  MT_CUDA_CHECK(cudaSetDevice(device));
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  c.device = device;
  c.alloc = cuda::install_cuda_allocator(device, c.stream);
  c.gemm = std::make_unique<cuda::Gemm>();
}

void synchronize() { MT_CUDA_CHECK(cudaStreamSynchronize(st())); }
int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
void* compute_stream() { return st(); }
int current_device() { return ctx().device; }
size_t peak_memory_bytes() { return ctx().alloc ? ctx().alloc->peak_bytes() : 0; }
void reset_peak_memory() {
  if (ctx().alloc) ctx().alloc->reset_peak();
}
std::string device_name() {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, ctx().device) != cudaSuccess) return "unknown GPU";
  return p.name;
}

Tensor linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor y = act({rows, out});
  cuda::linear_forward(gemm(), b(x), b(w), bias ? b(*bias) : nullptr, b(y), rows, out, in, st());
  return y;
}

Tensor linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dw, Tensor* db, bool need_dx) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  Tensor dx = need_dx ? act({rows, in}) : Tensor();
  cuda::linear_backward(gemm(), b(dy), b(x), b(w), need_dx ? b(dx) : nullptr, f(dw), db ? f(*db) : nullptr, rows, out,
                        in, st());
  return dx;
}

void linear_forward_into(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  MT_CHECK(y.numel() == rows * out && y.dtype() == DType::BF16, "linear_forward_into: bf16 output of {} x {} expected",
           rows, out);
  cuda::linear_forward(gemm(), b(x), b(w), bias ? b(*bias) : nullptr, b(y), rows, out, in, st());
}

Tensor linear_backward_data(const Tensor& dy, const Tensor& w) {
  const int64_t out = w.dim(0), in = w.dim(1), rows = dy.numel() / out;
  Tensor dx = act({rows, in});
  cuda::linear_backward(gemm(), b(dy), nullptr, b(w), b(dx), nullptr, nullptr, rows, out, in, st());
  return dx;
}

void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor* db) {
  const int64_t out = dw.dim(0), in = dw.dim(1), rows = x.numel() / in;
  cuda::linear_backward(gemm(), b(dy), b(x), nullptr, nullptr, f(dw), db ? f(*db) : nullptr, rows, out, in, st());
}

Tensor embedding_forward(const Tensor& ids, const Tensor& table) {
  const int64_t n = ids.numel(), h = table.dim(1);
  Tensor y = act({n, h});
  cuda::embedding_forward(ids.data<int32_t>(), b(table), b(y), n, h, st());
  return y;
}

void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  cuda::embedding_backward(ids.data<int32_t>(), b(dout), f(dtable), ids.numel(), dtable.dim(1), st());
}

void add_position_embedding(Tensor& x, const Tensor& pe, int64_t S, int64_t B) {
  cuda::add_position_embedding(b(x), b(pe), S, B, pe.dim(1), st());
}

void position_embedding_backward(const Tensor& dx, Tensor& dpe, int64_t S, int64_t B) {
  cuda::position_embedding_backward(b(dx), f(dpe), S, B, dpe.dim(1), st());
}

Tensor rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim});
  rstd = stat({rows});
  cuda::rmsnorm_forward(b(x), b(w), b(y), f(rstd), rows, dim, eps, st());
  return y;
}

Tensor rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dw) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = act({rows, dim});
  cuda::rmsnorm_backward(b(dy), b(x), b(w), f(rstd), b(dx), f(dw), rows, dim, st());
  return dx;
}

Tensor layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& bias, float eps, Tensor& mean, Tensor& rstd) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor y = act({rows, dim});
  mean = stat({rows});
  rstd = stat({rows});
  cuda::layernorm_forward(b(x), b(w), b(bias), b(y), f(mean), f(rstd), rows, dim, eps, st());
  return y;
}

Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dw, Tensor& db) {
  const int64_t dim = w.numel(), rows = x.numel() / dim;
  Tensor dx = act({rows, dim});
  cuda::layernorm_backward(b(dy), b(x), b(w), f(mean), f(rstd), b(dx), f(dw), f(db), rows, dim, st());
  return dx;
}

namespace {
cuda::RopeArgs rope_args(const RopeRef& r) {
  if (r.rot_dim <= 0) return {};
  return {f(*r.cos), f(*r.sin), r.rot_dim};
}
}  // namespace

void qkv_split(const Tensor& packed, Tensor& q, Tensor& k, Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
               int64_t D, const RopeRef& rope) {
  q = act({B, G * qpg, S, D});
  k = act({B, G, S, D});
  v = act({B, G, S, D});
  cuda::qkv_split(b(packed), b(q), b(k), b(v), S, B, G, qpg, D, rope_args(rope), st());
}

Tensor qkv_merge(const Tensor& q, const Tensor& k, const Tensor& v, int64_t S, int64_t B, int64_t G, int64_t qpg,
                 int64_t D, const RopeRef& rope) {
  Tensor packed = act({S * B, G * (qpg + 2) * D});
  cuda::qkv_merge(b(q), b(k), b(v), b(packed), S, B, G, qpg, D, rope_args(rope), st());
  return packed;
}

Tensor heads_to_rows(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor r = act({S * B, H * D});
  cuda::heads_to_rows(b(x), b(r), S, B, H, D, st());
  return r;
}

Tensor rows_to_heads(const Tensor& x, int64_t S, int64_t B, int64_t H, int64_t D) {
  Tensor h = act({B, H, S, D});
  cuda::rows_to_heads(b(x), b(h), S, B, H, D, st());
  return h;
}

void rope_forward(Tensor& x, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  cuda::rope_forward(b(x), f(cos), f(sin), x.dim(0), x.dim(1), x.dim(2), x.dim(3), rot_dim, st());
}

void rope_backward(Tensor& dx, const Tensor& cos, const Tensor& sin, int64_t rot_dim) {
  cuda::rope_backward(b(dx), f(cos), f(sin), dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3), rot_dim, st());
}

void attention_forward(const cpu::AttnParams& p, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                       Tensor& lse) {
  out = act(q.shape());
  lse = stat({p.B, p.Hq, p.S});
  cuda::attention_forward(p, b(q), b(k), b(v), b(out), f(lse), st());
}

void attention_backward(const cpu::AttnParams& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  dq = act(q.shape());
  dk = act(k.shape());
  dv = act(v.shape());
  cuda::attention_backward(p, b(q), b(k), b(v), b(out), f(lse), b(dout), b(dq), b(dk), b(dv), st());
}

Tensor swiglu_forward(const Tensor& h) {
  const int64_t rows = h.dim(0), F = h.dim(1) / 2;
  Tensor y = act({rows, F});
  cuda::swiglu_forward(b(h), b(y), rows, F, st());
  return y;
}

Tensor swiglu_backward(const Tensor& dy, const Tensor& h) {
  Tensor dh = act(h.shape());
  cuda::swiglu_backward(b(dy), b(h), b(dh), h.dim(0), h.dim(1) / 2, st());
  return dh;
}

Tensor gelu_forward(const Tensor& h, bool tanh_approx) {
  Tensor y = act(h.shape());
  cuda::gelu_forward(b(h), b(y), h.numel(), tanh_approx, st());
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& h, bool tanh_approx) {
  Tensor dh = act(h.shape());
  cuda::gelu_backward(b(dy), b(h), b(dh), h.numel(), tanh_approx, st());
  return dh;
}

Tensor dropout_forward(const Tensor& x, float p, uint64_t seed, uint64_t offset) {
  Tensor y = act(x.shape());
  cuda::dropout_forward(b(x), b(y), x.numel(), p, seed, offset, st());
  return y;
}

Tensor dropout_backward(const Tensor& dy, float p, uint64_t seed, uint64_t offset) {
  Tensor dx = act(dy.shape());
  cuda::dropout_backward(b(dy), b(dx), dy.numel(), p, seed, offset, st());
  return dx;
}

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, Tensor& losses, Tensor& lse) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  losses = stat({N});
  lse = stat({N});
  cuda::cross_entropy_forward(b(logits), targets.data<int32_t>(), f(losses), f(lse), N, V, V, st());
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  // In place: the logits are not needed after their gradient is formed.
  cuda::cross_entropy_backward(b(logits), targets.data<int32_t>(), f(lse), f(dloss), b(logits), N, V, V, st());
  return logits;
}

void add_inplace(Tensor& y, const Tensor& x) {
  MT_CHECK(y.numel() == x.numel(), "add_inplace: {} vs {}", y.shape_str(), x.shape_str());
  cuda::add_inplace(b(y), b(x), y.numel(), st());
}

void cast(const Tensor& src, Tensor& dst) {
  MT_CHECK(src.numel() == dst.numel(), "cast: {} vs {}", src.shape_str(), dst.shape_str());
  if (src.dtype() == DType::F32) cuda::cast(f(src), b(dst), src.numel(), st());
  else cuda::cast(b(src), f(dst), src.numel(), st());
}

double grad_norm_squared(const float* grads, int64_t n) {
  return cuda::grad_norm_squared_host({cuda::GradSpan{const_cast<float*>(grads), n}}, st());
}

double grad_norm_squared(const float* grads, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<cuda::GradSpan> spans;
  for (auto [lo, hi] : ranges)
    if (hi > lo) spans.push_back(cuda::GradSpan{const_cast<float*>(grads) + lo, hi - lo});
  if (spans.empty()) return 0.0;
  return cuda::grad_norm_squared_host(spans, st());
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
};

AdamW::AdamW(int64_t numel, std::vector<optim::ParamSpan> spans, double beta1, double beta2, double eps)
    : st_(new AdamWState{std::move(spans), nullptr, nullptr, beta1, beta2, eps}) {
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

void AdamW::step(float* params, const float* grads, uint16_t* params_bf16, double lr, double wd) {
  ++step_;
  std::vector<cuda::AdamWTensor> ts;
  for (const auto& sp : st_->spans) {
    cuda::AdamWTensor t;
    t.param = params + sp.offset;
    t.grad = grads + sp.offset;
    t.exp_avg = st_->m + sp.offset;
    t.exp_avg_sq = st_->v + sp.offset;
    t.param_bf16 = params_bf16 ? reinterpret_cast<bf16*>(params_bf16) + sp.offset : nullptr;
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
