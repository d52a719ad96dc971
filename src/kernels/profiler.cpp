#include "kernels/profiler.h"

#include <atomic>

#ifdef MT_HAVE_CUDA
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include "core/error.h"
#endif

namespace mt::ops {
namespace {
std::atomic<bool> g_nvtx{false};
}  // namespace

#ifdef MT_HAVE_CUDA
bool profiler_available() { return true; }

void profiler_start() {
  const cudaError_t e = cudaProfilerStart();
  MT_CHECK(e == cudaSuccess, "cudaProfilerStart: {}", cudaGetErrorString(e));
}

void profiler_stop() {
  const cudaError_t e = cudaProfilerStop();
  MT_CHECK(e == cudaSuccess, "cudaProfilerStop: {}", cudaGetErrorString(e));
}

void nvtx_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
void nvtx_pop() { nvtxRangePop(); }
#else
bool profiler_available() { return false; }
void profiler_start() {}
void profiler_stop() {}
void nvtx_push(const std::string&) {}
void nvtx_pop() {}
#endif

void set_nvtx_enabled(bool on) { g_nvtx = on && profiler_available(); }
bool nvtx_enabled() { return g_nvtx.load(std::memory_order_relaxed); }

}  // namespace mt::ops
