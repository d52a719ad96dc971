#include "model/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#ifdef MT_HAVE_CUDA
#include "kernels/cuda/vocab_parallel.h"
#endif

namespace mt::model {

namespace {
// CPU path: host I32 ids/labels and F32 values.
const int32_t* host_i32(const Tensor& t, int64_t n, const char* what) {
  MT_CHECK(t.device() == Device::CPU && t.dtype() == DType::I32 && t.numel() == n,
           "{}: expected {} host int32 ids, got {} {}", what, n, dtype_name(t.dtype()), t.shape_str());
  return t.data<int32_t>();
}
bool on_gpu(const Tensor& t) { return t.device() == Device::CUDA; }
[[maybe_unused]] void no_gpu(const char* what) { fail("{} of a GPU tensor in a build without CUDA", what); }
}  // namespace

Tensor vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table, const TensorParallel& tp) {
  const int64_t n = ids.numel(), vl = table.dim(0), h = table.dim(1), start = tp.rank() * vl;
  if (on_gpu(table)) {
#ifdef MT_HAVE_CUDA
    return ops::gpu::vocab_embedding_forward(ids, table, start);
#else
    no_gpu("vocab_parallel_embedding_forward");
#endif
  }
  const int32_t* id_p = host_i32(ids, n, "vocab_parallel_embedding_forward");
  Tensor x = Tensor::zeros({n, h});
  const float* t = table.data<float>();
  float* xd = x.data<float>();
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = id_p[i] - start;
    if (id >= 0 && id < vl) std::copy_n(t + id * h, h, xd + i * h);
  }
  return x;
}

void vocab_parallel_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const TensorParallel& tp) {
  const int64_t n = ids.numel(), vl = dtable.dim(0), h = dtable.dim(1), start = tp.rank() * vl;
  if (on_gpu(dtable)) {
#ifdef MT_HAVE_CUDA
    ops::gpu::vocab_embedding_backward(ids, dout, dtable, start);
    return;
#else
    no_gpu("vocab_parallel_embedding_backward");
#endif
  }
  const int32_t* id_p = host_i32(ids, n, "vocab_parallel_embedding_backward");
  const float* d = dout.data<float>();
  float* g = dtable.data<float>();
  // Rows may repeat: a fixed increasing order keeps the sum deterministic (threads split columns).
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t c = 0; c < h; ++c)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = id_p[i] - start;
      if (id >= 0 && id < vl) g[id * h + c] += d[i * h + c];
    }
}

void vocab_parallel_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const TensorParallel& tp,
                                          Tensor& losses, Tensor& lse) {
  const int64_t n = logits.dim(0), vl = logits.dim(1), start = tp.rank() * vl;
  if (on_gpu(logits)) {
#ifdef MT_HAVE_CUDA
    // The same three steps as below, with the statistics in fp32 device buffers that the TP
    // communicator reduces in place (in stream order with the kernels around it).
    Tensor mx = ops::gpu::vocab_ce_row_max(logits);
    if (tp.on()) tp.comm->all_reduce(mx.raw(), static_cast<size_t>(n), comm::DataType::F32, comm::ReduceOp::Max);
    Tensor stats = ops::gpu::vocab_ce_partial_stats(logits, labels, mx, start);
    if (tp.on()) tp.comm->all_reduce(stats.raw(), static_cast<size_t>(2 * n), comm::DataType::F32);
    ops::gpu::vocab_ce_finish(mx, stats, losses, lse);
    return;
#else
    no_gpu("vocab_parallel_cross_entropy_forward");
#endif
  }
  const int32_t* lab = host_i32(labels, n, "vocab_parallel_cross_entropy_forward");
  const float* x = logits.data<float>();
  std::vector<float> mx(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vl; ++j) m = std::max(m, x[r * vl + j]);
    mx[static_cast<size_t>(r)] = m;
  }
  if (tp.on()) tp.comm->all_reduce(mx.data(), mx.size(), comm::ReduceOp::Max);
  // Per row: sum of exp(x - global max) over this rank's columns, and the target's logit when
  // the target lies in this rank's range; both summed over TP in one call.
  std::vector<double> part(static_cast<size_t>(2 * n), 0.0);
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t j = 0; j < vl; ++j) s += std::exp(x[r * vl + j] - mx[static_cast<size_t>(r)]);
    part[static_cast<size_t>(2 * r)] = s;
    const int64_t t = lab[r] - start;
    if (t >= 0 && t < vl) part[static_cast<size_t>(2 * r + 1)] = x[r * vl + t];
  }
  if (tp.on()) tp.comm->all_reduce(part.data(), part.size());
  losses = Tensor::empty({n});
  lse = Tensor::empty({n});
  float* lo = losses.data<float>();
  float* ls = lse.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float l = mx[static_cast<size_t>(r)] + static_cast<float>(std::log(part[static_cast<size_t>(2 * r)]));
    ls[r] = l;
    lo[r] = l - static_cast<float>(part[static_cast<size_t>(2 * r + 1)]);
  }
}

Tensor vocab_parallel_cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                             const Tensor& dloss, const TensorParallel& tp) {
  const int64_t n = logits.dim(0), vl = logits.dim(1), start = tp.rank() * vl;
  if (on_gpu(logits)) {
#ifdef MT_HAVE_CUDA
    return ops::gpu::vocab_ce_backward(logits, labels, lse, dloss, start);
#else
    no_gpu("vocab_parallel_cross_entropy_backward");
#endif
  }
  const int32_t* lab = host_i32(labels, n, "vocab_parallel_cross_entropy_backward");
  MT_CHECK(dloss.device() == Device::CPU && dloss.dtype() == DType::F32 && dloss.numel() == n,
           "vocab_parallel_cross_entropy_backward: expected {} host f32 dloss values, got {}", n, dloss.shape_str());
  Tensor d = Tensor::empty({n, vl});
  const float* x = logits.data<float>();
  const float* l = lse.data<float>();
  const float* dl = dloss.data<float>();
  float* dd = d.data<float>();
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const float g = dl[r], lr = l[r];
    for (int64_t j = 0; j < vl; ++j) dd[r * vl + j] = g * std::exp(x[r * vl + j] - lr);
    const int64_t t = lab[r] - start;
    if (t >= 0 && t < vl) dd[r * vl + t] -= g;
  }
  return d;
}

}  // namespace mt::model
