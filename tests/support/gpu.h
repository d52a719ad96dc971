#pragma once
// The GPU of a test process: its context is made on first use and held until the process exits
// (as a run holds its own), shared by every GPU test of the binary.
#include "kernels/device.h"

namespace mt::test {

inline bool have_gpu() { return ops::gpu_count() > 0; }

inline ops::GpuContext& gpu() {
  static ops::GpuContext ctx(0);
  return ctx;
}

}  // namespace mt::test
