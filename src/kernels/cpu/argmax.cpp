// argmax_rows on the CPU (ops.def): the reference the GPU kernel (kernels/cuda/argmax.cu) is
// tested against, and the CPU engine's greedy step.
#include <cmath>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

Tensor argmax_rows(const Tensor& logits, int64_t vocab) {
  MT_CHECK(logits.ndim() == 2 && vocab > 0 && vocab <= logits.dim(1),
           "argmax_rows: logits {} must be [rows, V'] with the vocabulary {} within V'", logits.shape_str(), vocab);
  const Tensor x = logits.dtype() == DType::F32 ? logits : logits.to(DType::F32);  // widening is exact
  const int64_t R = x.dim(0), V = x.dim(1);
  Tensor out = Tensor::empty({R}, DType::I32);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x.data<float>() + r * V;
    int64_t best = 0;
    float bv = -INFINITY;
    bool any = false;
    for (int64_t v = 0; v < vocab; ++v) {
      if (std::isnan(row[v])) continue;
      if (!any || row[v] > bv) {  // strictly larger: the first index keeps a tie
        bv = row[v];
        best = v;
        any = true;
      }
    }
    out.data<int32_t>()[r] = static_cast<int32_t>(best);
  }
  return out;
}

}  // namespace mt::ops::host
