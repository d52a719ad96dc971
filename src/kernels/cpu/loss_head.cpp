// The loss head's bookkeeping on the CPU (upload, scaled_mask, accumulate_masked_loss of ops.def).
#include <cstring>

#include "core/error.h"
#include "kernels/op_backends.h"

namespace mt::ops::host {

Tensor upload(const void* host, const Shape& shape, DType dtype, Device device) {
  MT_CHECK(device == Device::CPU, "upload: the CPU implementation asked for a GPU tensor");
  Tensor t = Tensor::empty(shape, dtype);
  if (t.nbytes() > 0) std::memcpy(t.raw(), host, t.nbytes());
  return t;
}

Tensor scaled_mask(const Tensor& mask, float scale) {
  const int64_t n = mask.numel();
  check_vector(mask, Device::CPU, DType::F32, n, "scaled_mask");
  Tensor out = Tensor::empty({n});
  const float* m = mask.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = m[i] * scale;
  return out;
}

void accumulate_masked_loss(const Tensor& losses, const Tensor& mask, Tensor& acc) {
  check_masked_loss(losses, mask, acc, Device::CPU);
  const int64_t n = losses.numel();
  const float* l = losses.data<float>();
  const float* m = mask.data<float>();
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(l[i]) * m[i];  // fixed order: deterministic
  double a = 0;
  std::memcpy(&a, acc.raw(), sizeof a);
  a += s;
  std::memcpy(acc.raw(), &a, sizeof a);
}

}  // namespace mt::ops::host
