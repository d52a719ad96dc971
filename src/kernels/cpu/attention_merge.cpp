// Ring attention's log-sum-exp merge on the CPU (ops.def: attention_merge).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out, const Tensor& part_lse) {
  MT_CHECK(out.shape() == part_out.shape() && lse.shape() == part_lse.shape() && out.ndim() == 4 &&
               lse.numel() * out.dim(3) == out.numel() && out.dtype() == DType::F32 && lse.dtype() == DType::F32,
           "attention_merge: out {} / lse {} and part {} / {} do not match", out.shape_str(), lse.shape_str(),
           part_out.shape_str(), part_lse.shape_str());
  const int64_t rows = lse.numel(), D = out.dim(3);
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* po = part_out.data<float>();
  const float* pl = part_lse.data<float>();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    // +inf marks a row that saw no key in that part: it weighs nothing.
    const float a = l[r] == kInf ? -kInf : l[r], b = pl[r] == kInf ? -kInf : pl[r];
    const float m = std::max(a, b);
    if (m == -kInf) continue;  // neither part saw a key: stays zero with lse +inf
    const float wa = std::exp(a - m), wb = std::exp(b - m), sum = wa + wb;
    const float ca = wa / sum, cb = wb / sum;
    float* orow = o + r * D;
    const float* prow = po + r * D;
    for (int64_t d = 0; d < D; ++d) orow[d] = ca * orow[d] + cb * prow[d];
    l[r] = m + std::log(sum);
  }
}

}  // namespace mt::ops::host
