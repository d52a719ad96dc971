// Token embedding lookup. The backward is a scatter-add with repeated ids; to keep it
// deterministic and race-free, rows are grouped by id (stable, so each group is in increasing
// n) and each thread owns whole groups: every table row is summed in the same order always.
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/cpu/ops.h"

namespace mt::cpu {

namespace {

template <typename T>
void embedding_forward_impl(const int32_t* ids, const T* table, T* out, int64_t n, int64_t dim) {
#pragma omp parallel for schedule(static) if (n * dim > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const T* src = table + static_cast<int64_t>(ids[i]) * dim;
    std::copy(src, src + dim, out + i * dim);
  }
}

template <typename T>
void embedding_backward_impl(const int32_t* ids, const T* dout, T* dtable, int64_t n, int64_t dim) {
  if (n == 0 || dim == 0) return;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> starts;  // first position in `order` of each distinct id, plus n
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || ids[order[i]] != ids[order[i - 1]]) starts.push_back(i);
  starts.push_back(n);
  const int64_t groups = static_cast<int64_t>(starts.size()) - 1;
#pragma omp parallel for schedule(dynamic, 16) if (n * dim > 65536)
  for (int64_t g = 0; g < groups; ++g) {
    T* dst = dtable + static_cast<int64_t>(ids[order[starts[g]]]) * dim;
    for (int64_t i = starts[g]; i < starts[g + 1]; ++i) {
      const T* src = dout + order[i] * dim;
      for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
    }
  }
}

}  // namespace

void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim) {
  embedding_forward_impl(ids, table, out, n, dim);
}
void embedding_forward(const int32_t* ids, const double* table, double* out, int64_t n, int64_t dim) {
  embedding_forward_impl(ids, table, out, n, dim);
}
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim) {
  embedding_backward_impl(ids, dout, dtable, n, dim);
}
void embedding_backward(const int32_t* ids, const double* dout, double* dtable, int64_t n, int64_t dim) {
  embedding_backward_impl(ids, dout, dtable, n, dim);
}

}  // namespace mt::cpu
