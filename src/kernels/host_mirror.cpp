// HostMirror (host_mirror.h): the device-neutral half; GPU copies go to HostMirror::Gpu.
#include "kernels/host_mirror.h"

#include <cstring>

#include "core/error.h"
#include "kernels/host_mirror_gpu.h"

namespace mt::ops {

HostMirror::HostMirror() = default;
HostMirror::~HostMirror() = default;
HostMirror::HostMirror(HostMirror&&) noexcept = default;
HostMirror& HostMirror::operator=(HostMirror&&) noexcept = default;

void HostMirror::start(const std::vector<Tensor>& srcs) {
  size_t n = 0;
  for (const Tensor& t : srcs) {
    MT_CHECK((t.dtype() == DType::F32 || t.dtype() == DType::I32) && t.dtype() == srcs[0].dtype() &&
                 t.device() == srcs[0].device(),
             "HostMirror: a {} {} among {} tensors of one device", dtype_name(t.dtype()), t.shape_str(),
             dtype_name(srcs[0].dtype()));
    n += static_cast<size_t>(t.numel());
  }
  values_.resize(n);
  if (srcs.empty() || srcs[0].device() == Device::CPU) {
    size_t at = 0;
    for (const Tensor& t : srcs) {
      if (t.numel() > 0) std::memcpy(values_.data() + at, t.raw(), t.nbytes());
      at += static_cast<size_t>(t.numel());
    }
    return;
  }
  if (!gpu_) gpu_ = make_host_mirror_gpu();
  gpu_->start(srcs, n);
}

const std::vector<float>& HostMirror::wait() {
  if (gpu_ && gpu_->pending()) gpu_->wait(values_);
  return values_;
}

std::vector<int32_t> HostMirror::wait_i32() {
  const std::vector<float>& v = wait();
  std::vector<int32_t> out(v.size());
  static_assert(sizeof(float) == sizeof(int32_t));
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

}  // namespace mt::ops
