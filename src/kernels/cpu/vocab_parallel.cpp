// Vocab-parallel embedding and cross-entropy on the CPU (the vocab_* ops of ops.def): host I32
// ids/labels and fp32 values. A rank holds vocabulary entries [start, start + vl); the caller's
// ShardReduce combines the per-row statistics with the ranks that hold the others.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {
namespace {

const int32_t* host_i32(const Tensor& t, int64_t n, const char* what) {
  MT_CHECK(t.device() == Device::CPU && t.dtype() == DType::I32 && t.numel() == n,
           "{}: expected {} host int32 ids, got {} {}", what, n, dtype_name(t.dtype()), t.shape_str());
  return t.data<int32_t>();
}

}  // namespace

Tensor vocab_embedding_forward(const Tensor& ids, const Tensor& table, int64_t start) {
  const int64_t n = ids.numel(), vl = table.dim(0), h = table.dim(1);
  const int32_t* id_p = host_i32(ids, n, "vocab_embedding_forward");
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

void vocab_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, int64_t start) {
  const int64_t n = ids.numel(), vl = dtable.dim(0), h = dtable.dim(1);
  const int32_t* id_p = host_i32(ids, n, "vocab_embedding_backward");
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

void vocab_cross_entropy_forward(const Tensor& logits, const Tensor& labels, int64_t start, const ShardReduce& reduce,
                                 Tensor& losses, Tensor& lse) {
  const int64_t n = logits.dim(0), vl = logits.dim(1);
  const int32_t* lab = host_i32(labels, n, "vocab_cross_entropy_forward");
  const float* x = logits.data<float>();
  std::vector<float> mx(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vl; ++j) m = std::max(m, x[r * vl + j]);
    mx[static_cast<size_t>(r)] = m;
  }
  if (reduce) reduce(mx.data(), mx.size(), ReduceType::F32, ReduceOp::Max);
  // Per row: sum of exp(x - global max) over this rank's columns, and the target's logit when
  // the target lies in this rank's range; both combined over the ranks in one call (in fp64).
  std::vector<double> part(static_cast<size_t>(2 * n), 0.0);
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t j = 0; j < vl; ++j) s += std::exp(x[r * vl + j] - mx[static_cast<size_t>(r)]);
    part[static_cast<size_t>(2 * r)] = s;
    const int64_t t = lab[r] - start;
    if (t >= 0 && t < vl) part[static_cast<size_t>(2 * r + 1)] = x[r * vl + t];
  }
  if (reduce) reduce(part.data(), part.size(), ReduceType::F64, ReduceOp::Sum);
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

Tensor vocab_cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse, const Tensor& dloss,
                                    int64_t start) {
  const int64_t n = logits.dim(0), vl = logits.dim(1);
  const int32_t* lab = host_i32(labels, n, "vocab_cross_entropy_backward");
  MT_CHECK(dloss.device() == Device::CPU && dloss.dtype() == DType::F32 && dloss.numel() == n,
           "vocab_cross_entropy_backward: expected {} host f32 dloss values, got {}", n, dloss.shape_str());
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

}  // namespace mt::ops::host
