// token_logprobs on the CPU (ops.def): the reference the GPU kernel (kernels/cuda/token_logprobs.cu)
// is tested against, and the CPU engine's logprobs. Sums in double, so a 128k vocabulary of fp32
// logits loses nothing to the order of the sum.
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

Tensor token_logprobs(const Tensor& logits, const Tensor& ids, int64_t vocab) {
  MT_CHECK(logits.ndim() == 2 && vocab > 0 && vocab <= logits.dim(1),
           "token_logprobs: logits {} must be [rows, V'] with the vocabulary {} within V'", logits.shape_str(), vocab);
  MT_CHECK(ids.dtype() == DType::I32 && ids.ndim() == 1 && ids.dim(0) == logits.dim(0),
           "token_logprobs: ids {} {} must be I32 [{}], one per row", dtype_name(ids.dtype()), ids.shape_str(),
           logits.dim(0));
  const Tensor x = logits.dtype() == DType::F32 ? logits : logits.to(DType::F32);  // widening is exact
  const int64_t R = x.dim(0), V = x.dim(1);
  Tensor out = Tensor::empty({R}, DType::F32);
  for (int64_t r = 0; r < R; ++r) {
    const float* row = x.data<float>() + r * V;
    const int32_t id = ids.data<int32_t>()[r];
    if (id < 0 || id >= vocab) {
      out.data<float>()[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    double mx = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) mx = std::fmax(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    out.data<float>()[r] = static_cast<float>(static_cast<double>(row[id]) - mx - std::log(sum));
  }
  return out;
}

}  // namespace mt::ops::host
