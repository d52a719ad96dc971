#pragma once
// Small fp32 (or i32) device tensors read on the host without a synchronisation of their own. start()
// queues their copies into host memory (pinned, on the GPU) in stream order and returns at once;
// wait() blocks until those copies are done, not until the stream is idle. The MoE router reads
// its load-balancing statistics this way: by the time it needs them the layer has synchronised
// for the dispatch plan's counts (the step's one host read per MoE layer, through a HostMirror
// too, after the permute is queued), so wait() returns without waiting. On the CPU the copies
// are done by start().
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace mt::ops {

class HostMirror {
 public:
  HostMirror();
  ~HostMirror();
  HostMirror(HostMirror&&) noexcept;
  HostMirror& operator=(HostMirror&&) noexcept;
  // Copies `srcs` (all f32 or all i32, on one device) one after the other; a previous start's values are
  // overwritten, so wait() for them first.
  void start(const std::vector<Tensor>& srcs);
  // The values of the last start's tensors, in order (srcs[0]'s elements first).
  const std::vector<float>& wait();
  // The same for I32 tensors (start copies 4-byte elements as they are).
  std::vector<int32_t> wait_i32();

  struct Gpu;  // the CUDA side (kernels/cuda/host_mirror.cpp, or cuda_absent.cpp)

 private:
  std::vector<float> values_;
  std::unique_ptr<Gpu> gpu_;  // set while a GPU copy is pending
};

}  // namespace mt::ops
