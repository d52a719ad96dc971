// A build without the CUDA backend: the gpu:: half of every op and the GPU runtime objects exist
// (so that device-neutral code needs no #ifdef) and say that this build cannot run them. No
// CUDA tensor can exist in such a build, so the ops are reached only by a bug.
#ifndef MT_HAVE_CUDA

#include "core/error.h"
#include "kernels/device.h"
#include "kernels/host_mirror_gpu.h"
#include "kernels/op_backends.h"

namespace mt::ops {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  fail("{}: this build has no CUDA backend (nvcc was not found at build time)", what);
}

}  // namespace

namespace gpu {
#define MT_DEFAULT(v)
#define MT_OP(result, name, on, params, args) \
  result name params { no_cuda("ops::" #name); }
#include "kernels/ops.def"
#undef MT_OP
#undef MT_DEFAULT
}  // namespace gpu

int gpu_count() { return 0; }

std::unique_ptr<HostMirror::Gpu> make_host_mirror_gpu() { no_cuda("HostMirror"); }

struct GpuContext::Impl {};
GpuContext::GpuContext(int) { no_cuda("--device cuda"); }
GpuContext::~GpuContext() = default;
int GpuContext::device() const { return 0; }
void* GpuContext::compute_stream() const { return nullptr; }
std::string GpuContext::name() const { return "none"; }
size_t GpuContext::peak_memory_bytes() const { return 0; }
size_t GpuContext::peak_memory_with_scratch_bytes() const { return 0; }
void GpuContext::reset_peak_memory() {}
void GpuContext::synchronize() const {}
bool GpuContext::idle() const { return true; }
GpuContext& gpu_context() { no_cuda("the GPU context"); }

struct EventTimeline::Impl {};
EventTimeline::EventTimeline(int) { fail("GPU op timing needs a build with the CUDA backend"); }
EventTimeline::~EventTimeline() = default;
void EventTimeline::mark(int) noexcept {}
void EventTimeline::resolve(double*) {}
size_t EventTimeline::pending() const noexcept { return 0; }

struct StreamGraph::Impl {};
StreamGraph::StreamGraph() = default;
StreamGraph::~StreamGraph() = default;
void StreamGraph::capture(const std::function<void()>&) { no_cuda("CUDA graphs"); }
void StreamGraph::launch() { no_cuda("CUDA graphs"); }
bool StreamGraph::ready() const { return false; }
std::string StreamGraph::census() const { return "no graph (a build without CUDA)"; }

int64_t DeviceArena::tally(const std::function<void()>& f) {
  f();
  return 0;
}
DeviceArena::DeviceArena(int64_t) { no_cuda("a device arena"); }
DeviceArena::~DeviceArena() = default;
void DeviceArena::serve(const std::function<void()>& f) { f(); }

}  // namespace mt::ops

#endif  // MT_HAVE_CUDA
