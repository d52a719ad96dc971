#pragma once
// Timing spans of the compute stream with CUDA events (model::OpTimes on the GPU). No CUDA
// headers here, so host code built by the C++ compiler can hold one.
//
// The timeline is a sequence of boundaries, each a CUDA event recorded on the compute stream;
// the span between two consecutive boundaries belongs to one category (or to none). Recording
// never synchronises: elapsed times are read in resolve(), or opportunistically for spans whose
// events have already completed, and their events go back to a pool for reuse.
#include <cstddef>
#include <memory>

namespace mt::ops::gpu {

class EventTimeline {
 public:
  // `categories`: the number of span categories resolve() reports. Needs ops::gpu::init().
  explicit EventTimeline(int categories);
  ~EventTimeline();
  EventTimeline(const EventTimeline&) = delete;
  EventTimeline& operator=(const EventTimeline&) = delete;

  // Records a boundary on the compute stream; the span since the previous boundary is charged
  // to `category` (-1: not timed). Never synchronises and never throws (it runs in scope
  // destructors): a CUDA failure stops the timing and the next resolve() reports it.
  void mark(int category) noexcept;
  // Waits for the last boundary's event, then adds every span's elapsed seconds into
  // seconds[category] (an array of `categories`) and recycles the events. The last boundary
  // stays as the start of the next span.
  void resolve(double* seconds);
  // Boundaries held: those of unfolded spans, plus the last one (tests).
  size_t pending() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether all work queued on the compute stream has finished (cudaStreamQuery; no wait).
bool compute_stream_idle();

}  // namespace mt::ops::gpu
