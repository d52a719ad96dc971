// The run's GPU context (kernels/device.h): device, compute stream, allocator, cuBLASLt handle.
#include "kernels/cuda/context.h"

#include "core/error.h"

namespace mt::ops {
namespace {

// The live context: registered by its constructor, cleared by its destructor. The run owns the
// object; this is only how the ops on CUDA tensors find it.
GpuContext* g_live = nullptr;

}  // namespace

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

GpuContext::GpuContext(int device) : impl_(std::make_unique<Impl>()) {
  MT_CHECK(g_live == nullptr, "a second GPU context while one is live (a run makes one)");
  if (gpu_count() == 0) fail("--device cuda: no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)");
  Impl& c = *impl_;
  MT_CUDA_CHECK(cudaSetDevice(device));
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  c.device = device;
  c.alloc = cuda::install_cuda_allocator(device, c.stream);
  MT_CHECK(c.alloc->device_index() == device, "a GPU context for device {} after one for device {}", device,
           c.alloc->device_index());
  c.alloc->set_stream(c.stream);  // the allocator outlives contexts: it takes each one's stream
  c.gemm = std::make_unique<cuda::Gemm>();
  g_live = this;
}

GpuContext::~GpuContext() {
  Impl& c = *impl_;
  if (g_live == this) g_live = nullptr;
  // Errors here would only repeat one that the run has reported (or is exiting with).
  if (cudaStreamSynchronize(c.stream) != cudaSuccess) cudaGetLastError();
  c.gemm.reset();
  c.alloc->set_stream(nullptr);  // frees after this run are ordered on the default stream
  if (cudaStreamDestroy(c.stream) != cudaSuccess) cudaGetLastError();
}

int GpuContext::device() const { return impl_->device; }
void* GpuContext::compute_stream() const { return impl_->stream; }

std::string GpuContext::name() const {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, impl_->device) != cudaSuccess) return "unknown GPU";
  return p.name;
}

size_t GpuContext::peak_memory_bytes() const { return impl_->alloc->peak_bytes(); }
void GpuContext::reset_peak_memory() { impl_->alloc->reset_peak(); }
void GpuContext::synchronize() const { MT_CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

bool GpuContext::idle() const {
  const cudaError_t e = cudaStreamQuery(impl_->stream);
  if (e == cudaErrorNotReady) {
    // "Not ready" is a state, not an error: keep it out of the next launch check.
    if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(e);
  return true;
}

GpuContext& gpu_context() {
  MT_CHECK(g_live != nullptr, "the CUDA backend used without a GPU context (the run makes one: ops::GpuContext)");
  return *g_live;
}

}  // namespace mt::ops

namespace mt::cuda {

ops::GpuContext::Impl& context() { return ops::gpu_context().impl(); }

}  // namespace mt::cuda
