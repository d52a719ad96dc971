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
  for (Impl::StreamPool* p : {&c.side, &c.deferred}) {
    for (cudaStream_t s : p->streams)
      if (cudaStreamSynchronize(s) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess) cudaGetLastError();
    for (cudaEvent_t e : p->joins) cudaEventDestroy(e);
    if (p->fork) cudaEventDestroy(p->fork);
  }
  c.deferred_keep.clear();
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
size_t GpuContext::peak_memory_with_scratch_bytes() const { return impl_->alloc->peak_with_scratch_bytes(); }
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

namespace {

ops::GpuContext::Impl::StreamPool& pool(SideStreams::Join join) {
  ops::GpuContext::Impl& c = context();
  return join == SideStreams::Join::Deferred ? c.deferred : c.side;
}

}  // namespace

SideStreams::SideStreams(cudaStream_t main, Join join) : main_(main), join_(join) {
  const int n = side_stream_count();
  if (n == 1) return;
  ops::GpuContext::Impl::StreamPool& p = pool(join_);
  if (p.streams.empty()) {
    p.streams.resize(static_cast<size_t>(n));
    p.joins.resize(static_cast<size_t>(n));
    p.pending.assign(static_cast<size_t>(n), false);
    for (int i = 0; i < n; ++i) {
      MT_CUDA_CHECK(cudaStreamCreateWithFlags(&p.streams[static_cast<size_t>(i)], cudaStreamNonBlocking));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&p.joins[static_cast<size_t>(i)], cudaEventDisableTiming));
    }
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&p.fork, cudaEventDisableTiming));
  }
  MT_CUDA_CHECK(cudaEventRecord(p.fork, main_));
}

cudaStream_t SideStreams::next() {
  ops::GpuContext::Impl::StreamPool& p = pool(join_);
  if (p.streams.empty()) return main_;
  const size_t i = next_++ % p.streams.size();
  if (i >= used_) {  // first use of this side stream in the fork: start it after main's work
    MT_CUDA_CHECK(cudaStreamWaitEvent(p.streams[i], p.fork, 0));
    used_ = i + 1;
  }
  return p.streams[i];
}

SideStreams::~SideStreams() {
  ops::GpuContext::Impl::StreamPool& p = pool(join_);
  for (size_t i = 0; i < used_; ++i) {
    // A failure here leaves the context broken; the next checked call reports it.
    if (cudaEventRecord(p.joins[i], p.streams[i]) != cudaSuccess) return;
    if (join_ == Join::Deferred) {
      p.pending[i] = true;  // the event's latest record covers this stream's earlier deferred work
    } else if (cudaStreamWaitEvent(main_, p.joins[i], 0) != cudaSuccess) {
      return;
    }
  }
}

void keep_until_joined(std::shared_ptr<const void> t) { context().deferred_keep.push_back(std::move(t)); }

void join_deferred(cudaStream_t main) {
  ops::GpuContext::Impl& c = context();
  ops::GpuContext::Impl::StreamPool& p = c.deferred;
  for (size_t i = 0; i < p.streams.size(); ++i) {
    if (!p.pending[i]) continue;
    MT_CUDA_CHECK(cudaStreamWaitEvent(main, p.joins[i], 0));
    p.pending[i] = false;
  }
  // Freed on the host now, reused only by work ordered after this wait on `main`.
  c.deferred_keep.clear();
}

}  // namespace mt::cuda
