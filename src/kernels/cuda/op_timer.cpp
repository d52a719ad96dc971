// CUDA event timeline for per-op GPU time (ops::EventTimeline, kernels/device.h).
#include <cuda_runtime_api.h>

#include <deque>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/context.h"

namespace mt::ops {
namespace {

// cudaEventQuery / cudaStreamQuery answer "not ready" through the error channel; make sure it
// is not left behind as the thread's last error, where a later launch check would report it.
void clear_not_ready() {
  if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
}

// Below this many outstanding boundaries, mark() does not look for completed spans at all.
constexpr size_t kDrainAbove = 512;
// And it looks only every this many marks: a query costs about a microsecond.
constexpr size_t kDrainEvery = 256;

}  // namespace

struct EventTimeline::Impl {
  struct Boundary {
    cudaEvent_t ev;
    int category;  // of the span that ends at this boundary (-1: untimed)
  };
  int categories = 0;
  cudaStream_t stream = nullptr;
  std::deque<Boundary> boundaries;  // in record order; front is the oldest unfolded one
  std::vector<cudaEvent_t> pool;    // events free for reuse
  std::vector<double> ms;           // folded span times not yet handed out by resolve()
  size_t marks_since_drain = 0;
  cudaError_t error = cudaSuccess;  // first failure; timing stops until resolve() reports it

  // Folds the spans whose end events have completed, oldest first, and recycles their start
  // events. Events complete in stream order, so the first unfinished one ends the scan.
  void drain() {
    while (boundaries.size() >= 2 && error == cudaSuccess) {
      const cudaError_t q = cudaEventQuery(boundaries[1].ev);
      if (q == cudaErrorNotReady) {
        clear_not_ready();
        return;
      }
      if (q != cudaSuccess) {
        error = q;
        return;
      }
      if (boundaries[1].category >= 0) {
        float span = 0.f;
        const cudaError_t e = cudaEventElapsedTime(&span, boundaries[0].ev, boundaries[1].ev);
        if (e != cudaSuccess) {
          error = e;
          return;
        }
        ms[static_cast<size_t>(boundaries[1].category)] += span;
      }
      pool.push_back(boundaries.front().ev);
      boundaries.pop_front();
    }
  }
};

EventTimeline::EventTimeline(int categories) : impl_(std::make_unique<Impl>()) {
  impl_->categories = categories;
  impl_->stream = cuda::compute_stream();  // the ops' stream: spans bracket their kernels
  impl_->ms.assign(static_cast<size_t>(categories), 0.0);
}

EventTimeline::~EventTimeline() {
  // Destroying an event whose record is still pending is allowed: the driver releases it once
  // the stream reaches it. Errors here would only repeat one that resolve() reports.
  for (auto& b : impl_->boundaries) cudaEventDestroy(b.ev);
  for (cudaEvent_t e : impl_->pool) cudaEventDestroy(e);
}

void EventTimeline::mark(int category) noexcept {
  Impl& m = *impl_;
  if (m.error != cudaSuccess) return;
  if (category >= m.categories) category = -1;
  cudaEvent_t ev = nullptr;
  if (!m.pool.empty()) {
    ev = m.pool.back();
    m.pool.pop_back();
  } else if (const cudaError_t e = cudaEventCreate(&ev); e != cudaSuccess) {
    m.error = e;
    return;
  }
  if (const cudaError_t e = cudaEventRecord(ev, m.stream); e != cudaSuccess) {
    cudaEventDestroy(ev);
    m.error = e;
    return;
  }
  try {
    m.boundaries.push_back({ev, category});
  } catch (...) {  // out of host memory: stop timing rather than throw from a destructor
    cudaEventDestroy(ev);
    m.error = cudaErrorMemoryAllocation;
    return;
  }
  // Keep the backlog bounded over a long run without ever waiting for the GPU.
  if (++m.marks_since_drain >= kDrainEvery && m.boundaries.size() > kDrainAbove) {
    m.marks_since_drain = 0;
    m.drain();
  }
}

void EventTimeline::resolve(double* seconds) {
  Impl& m = *impl_;
  if (m.error == cudaSuccess && m.boundaries.size() >= 2) {
    const cudaError_t e = cudaEventSynchronize(m.boundaries.back().ev);
    if (e != cudaSuccess) m.error = e;
  }
  m.drain();
  if (m.error != cudaSuccess) {
    const cudaError_t e = m.error;
    // Start over: the spans recorded so far cannot be trusted.
    for (auto& b : m.boundaries) cudaEventDestroy(b.ev);
    m.boundaries.clear();
    m.ms.assign(m.ms.size(), 0.0);
    m.error = cudaSuccess;
    fail("GPU op timing failed: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  for (size_t i = 0; i < m.ms.size(); ++i) {
    seconds[i] += m.ms[i] * 1e-3;
    m.ms[i] = 0.0;
  }
}

size_t EventTimeline::pending() const noexcept { return impl_->boundaries.size(); }

}  // namespace mt::ops
