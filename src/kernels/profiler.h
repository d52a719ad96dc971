#pragma once
// Hooks for external profilers, through the device layer: cudaProfilerStart/Stop (so `nsys
// profile --capture-range=cudaProfilerApi` records exactly the steps --profile asks for, as with
// Megatron-LM) and NVTX ranges (per layer and per pipeline action). In builds without CUDA they
// do nothing; NVTX ranges cost one branch unless enabled (--profile or --nvtx-ranges).
#include <string>

#include <fmt/format.h>

namespace mt::ops {

// Whether this build can drive the CUDA profiler (a CUDA build); the hooks below are no-ops otherwise.
bool profiler_available();
void profiler_start();
void profiler_stop();

void set_nvtx_enabled(bool on);
bool nvtx_enabled();
void nvtx_push(const std::string& name);
void nvtx_pop();

// A scoped NVTX range; the name is formatted only when ranges are enabled.
class NvtxRange {
 public:
  template <typename... Args>
  explicit NvtxRange(fmt::format_string<Args...> f, Args&&... args) {
    if (!nvtx_enabled()) return;
    nvtx_push(fmt::format(f, std::forward<Args>(args)...));
    on_ = true;
  }
  ~NvtxRange() {
    if (on_) nvtx_pop();
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool on_ = false;
};

}  // namespace mt::ops
