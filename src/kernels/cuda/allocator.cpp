// CUDA error reporting and the stream-ordered device allocator.
#include <cuda_runtime_api.h>

#include <mutex>

#include "core/error.h"
#include "core/memory_timeline.h"
#include "kernels/cuda/ops_cuda.h"

namespace mt::cuda {

void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky launch error so the next check reports its own
  fail("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e), what, file, line);
}

CudaAllocator::CudaAllocator(int device, cudaStream_t stream, uint64_t release_threshold)
    : device_(device), stream_(stream) {
  MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device));
  // Keep freed memory in the pool: without a threshold the pool returns it to the driver at
  // every synchronisation and the next step pays cudaMalloc costs again.
  uint64_t thr = release_threshold;
  MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &thr));
}

void* CudaAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (tallying_) tally_ += arena_round(bytes);
  void* p = nullptr;
  if (arena_ && arena_used_ + arena_round(bytes) <= arena_size_) {
    p = arena_ + arena_used_;
    arena_used_ += arena_round(bytes);
  } else {
    if (arena_) ++arena_misses_;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
    if (e != cudaSuccess) out_of_memory(e, bytes, "");
  }
  in_use_ += bytes;
  if (in_use_ > peak_) peak_ = in_use_;
  if (in_use_ + scratch_ > peak_all_) peak_all_ = in_use_ + scratch_;
  memory_timeline::on_alloc(Device::CUDA, p, bytes);
  return p;
}

void CudaAllocator::out_of_memory(cudaError_t e, size_t bytes, const char* what) const {
  cudaGetLastError();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const double mib = 1 << 20;
  fail("out of GPU memory allocating {:.1f} MiB{} on device {} ({}; {:.1f} MiB in use by tensors, {:.1f} MiB by "
       "kernel workspaces, {:.1f} of {:.1f} MiB free): reduce --micro-batch-size or --seq-length, or enable "
       "activation recomputation",
       static_cast<double>(bytes) / mib, what, device_, cudaGetErrorName(e), static_cast<double>(in_use_) / mib,
       static_cast<double>(scratch_) / mib, static_cast<double>(free_b) / mib, static_cast<double>(total_b) / mib);
}

void CudaAllocator::note_scratch(int64_t delta) {
  if (delta < 0)
    scratch_ -= static_cast<size_t>(-delta) <= scratch_ ? static_cast<size_t>(-delta) : scratch_;
  else
    scratch_ += static_cast<size_t>(delta);
  if (in_use_ + scratch_ > peak_all_) peak_all_ = in_use_ + scratch_;
}

void CudaAllocator::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  memory_timeline::on_free(Device::CUDA, ptr);
  // Destructors must not throw: a failing free here means the context is already broken, and
  // the next checked call reports it. An arena's memory goes back with the arena, all at once.
  if (!owned_by_arena(ptr) && cudaFreeAsync(ptr, stream_) != cudaSuccess) cudaGetLastError();
  in_use_ -= bytes <= in_use_ ? bytes : in_use_;
}

void CudaAllocator::begin_tally() {
  tallying_ = true;
  tally_ = 0;
}

size_t CudaAllocator::end_tally() {
  tallying_ = false;
  return tally_;
}

void CudaAllocator::serve_from(char* base, size_t bytes) {
  arena_ = base;
  arena_size_ = base ? bytes : 0;
  arena_used_ = arena_misses_ = 0;
  if (base && !owned_by_arena(base)) arena_ranges_.emplace_back(base, base + bytes);
}

void CudaAllocator::release_arena(const char* base) {
  if (arena_ == base) serve_from(nullptr, 0);
  std::erase_if(arena_ranges_, [&](const auto& r) { return r.first == base; });
}

bool CudaAllocator::owned_by_arena(const void* p) const {
  const auto* c = static_cast<const char*>(p);
  for (const auto& [b, e] : arena_ranges_)
    if (c >= b && c < e) return true;
  return false;
}

void CudaAllocator::trim(size_t keep_bytes) {
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MT_CUDA_CHECK(cudaMemPoolTrimTo(pool_, keep_bytes));
}

namespace {

CudaAllocator* g_alloc = nullptr;

// core's device copy hook: ordered after the allocator stream's work and synchronous for the host.
void copy_hook(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  (void)dst_dev, (void)src_dev;  // unified addressing: cudaMemcpyDefault infers the direction
  const cudaStream_t s = g_alloc ? g_alloc->stream() : nullptr;
  MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  MT_CUDA_CHECK(cudaStreamSynchronize(s));
}
// core's device zero hook: stream-ordered on the allocator stream, like the allocation itself.
void zero_hook(void* dst, size_t bytes) {
  MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, g_alloc ? g_alloc->stream() : nullptr));
}

}  // namespace

CudaAllocator* install_cuda_allocator(int device, cudaStream_t stream) {
  static std::once_flag once;
  std::call_once(once, [&] {
    MT_CUDA_CHECK(cudaSetDevice(device));
    g_alloc = new CudaAllocator(device, stream);  // lives for the process, as the registry
    register_cuda_allocator(g_alloc);
    register_device_copy(copy_hook);
    register_device_zero(zero_hook);
  });
  return g_alloc;
}

void note_scratch_bytes(const void* p, int64_t delta) {
  if (g_alloc) g_alloc->note_scratch(delta);
  if (delta > 0)
    memory_timeline::on_alloc(Device::CUDA, p, static_cast<size_t>(delta));
  else
    memory_timeline::on_free(Device::CUDA, p);
}

void scratch_out_of_memory(cudaError_t e, size_t bytes) {
  if (g_alloc) g_alloc->out_of_memory(e, bytes, " of kernel workspace");
  check_cuda(e, "cudaMallocAsync (kernel workspace)", __FILE__, __LINE__);  // no allocator installed
  fail("cudaMallocAsync (kernel workspace) failed");
}

}  // namespace mt::cuda
