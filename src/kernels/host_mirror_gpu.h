#pragma once
// The CUDA side of HostMirror (host_mirror.h): a pinned buffer that grows to the largest set of
// tensors, the copies on the compute stream and an event after them.
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "kernels/host_mirror.h"

namespace mt::ops {

struct HostMirror::Gpu {
  virtual ~Gpu() = default;
  virtual void start(const std::vector<Tensor>& srcs, size_t total) = 0;
  virtual bool pending() const = 0;
  virtual void wait(std::vector<float>& out) = 0;  // copies the pinned values into out
};

std::unique_ptr<HostMirror::Gpu> make_host_mirror_gpu();

}  // namespace mt::ops
