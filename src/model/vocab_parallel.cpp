#include "model/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace mt::model {

Tensor vocab_parallel_embedding_forward(const std::vector<int32_t>& ids, const Tensor& table, const TensorParallel& tp) {
  const int64_t n = static_cast<int64_t>(ids.size()), vl = table.dim(0), h = table.dim(1), start = tp.rank() * vl;
  Tensor x = Tensor::zeros({n, h});
  const float* t = table.data<float>();
  float* xd = x.data<float>();
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[static_cast<size_t>(i)] - start;
    if (id >= 0 && id < vl) std::copy_n(t + id * h, h, xd + i * h);
  }
  return x;
}

void vocab_parallel_embedding_backward(const std::vector<int32_t>& ids, const Tensor& dout, Tensor& dtable,
                                       const TensorParallel& tp) {
  const int64_t n = static_cast<int64_t>(ids.size()), vl = dtable.dim(0), h = dtable.dim(1), start = tp.rank() * vl;
  const float* d = dout.data<float>();
  float* g = dtable.data<float>();
  // Rows may repeat: a fixed increasing order keeps the sum deterministic (threads split columns).
#pragma omp parallel for schedule(static) if (n * h > 65536)
  for (int64_t c = 0; c < h; ++c)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[static_cast<size_t>(i)] - start;
      if (id >= 0 && id < vl) g[id * h + c] += d[i * h + c];
    }
}

void vocab_parallel_cross_entropy_forward(const Tensor& logits, const std::vector<int32_t>& labels,
                                          const TensorParallel& tp, Tensor& losses, Tensor& lse) {
  const int64_t n = logits.dim(0), vl = logits.dim(1), start = tp.rank() * vl;
  const float* x = logits.data<float>();
  std::vector<float> mx(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < vl; ++j) m = std::max(m, x[r * vl + j]);
    mx[static_cast<size_t>(r)] = m;
  }
  tp.comm->all_reduce(mx.data(), mx.size(), comm::ReduceOp::Max);
  // Per row: sum of exp(x - global max) over this rank's columns, and the target's logit when
  // the target lies in this rank's range; both summed over TP in one call.
  std::vector<double> part(static_cast<size_t>(2 * n), 0.0);
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    double s = 0;
    for (int64_t j = 0; j < vl; ++j) s += std::exp(x[r * vl + j] - mx[static_cast<size_t>(r)]);
    part[static_cast<size_t>(2 * r)] = s;
    const int64_t t = labels[static_cast<size_t>(r)] - start;
    if (t >= 0 && t < vl) part[static_cast<size_t>(2 * r + 1)] = x[r * vl + t];
  }
  tp.comm->all_reduce(part.data(), part.size());
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

Tensor vocab_parallel_cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& labels, const Tensor& lse,
                                             const std::vector<float>& dloss, const TensorParallel& tp) {
  const int64_t n = logits.dim(0), vl = logits.dim(1), start = tp.rank() * vl;
  Tensor d = Tensor::empty({n, vl});
  const float* x = logits.data<float>();
  const float* l = lse.data<float>();
  float* dd = d.data<float>();
#pragma omp parallel for schedule(static) if (n * vl > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const float g = dloss[static_cast<size_t>(r)], lr = l[r];
    for (int64_t j = 0; j < vl; ++j) dd[r * vl + j] = g * std::exp(x[r * vl + j] - lr);
    const int64_t t = labels[static_cast<size_t>(r)] - start;
    if (t >= 0 && t < vl) dd[r * vl + t] -= g;
  }
  return d;
}

}  // namespace mt::model
