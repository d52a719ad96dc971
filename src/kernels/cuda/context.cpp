// The run's GPU context (kernels/device.h): device, compute stream, allocator, cuBLASLt handle.
#include "kernels/cuda/context.h"

#include <cstdlib>

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
  for (cudaStream_t s : c.side)
    if (cudaStreamDestroy(s) != cudaSuccess) cudaGetLastError();
  for (cudaEvent_t e : c.joins) cudaEventDestroy(e);
  if (c.fork) cudaEventDestroy(c.fork);
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

namespace {

int side_stream_count() {
  static const int n = [] {
    const char* v = std::getenv("MT_SIDE_STREAMS");
    const int k = v ? std::atoi(v) : 4;
    return k < 1 ? 1 : k > 8 ? 8 : k;
  }();
  return n;
}

}  // namespace

SideStreams::SideStreams(cudaStream_t main) : main_(main) {
  ops::GpuContext::Impl& c = context();
  const int n = side_stream_count();
  if (n == 1) return;
  if (c.side.empty()) {
    c.side.resize(static_cast<size_t>(n));
    c.joins.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      MT_CUDA_CHECK(cudaStreamCreateWithFlags(&c.side[static_cast<size_t>(i)], cudaStreamNonBlocking));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&c.joins[static_cast<size_t>(i)], cudaEventDisableTiming));
    }
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&c.fork, cudaEventDisableTiming));
  }
  MT_CUDA_CHECK(cudaEventRecord(c.fork, main_));
}

cudaStream_t SideStreams::next() {
  ops::GpuContext::Impl& c = context();
  if (c.side.empty()) return main_;
  const size_t i = next_++ % c.side.size();
  if (i >= used_) {  // first use of this side stream in the fork: start it after main's work
    MT_CUDA_CHECK(cudaStreamWaitEvent(c.side[i], c.fork, 0));
    used_ = i + 1;
  }
  return c.side[i];
}

SideStreams::~SideStreams() {
  ops::GpuContext::Impl& c = context();
  for (size_t i = 0; i < used_; ++i) {
    // A failure here leaves the context broken; the next checked call reports it.
    if (cudaEventRecord(c.joins[i], c.side[i]) != cudaSuccess || cudaStreamWaitEvent(main_, c.joins[i], 0) != cudaSuccess)
      return;
  }
}

}  // namespace mt::cuda
