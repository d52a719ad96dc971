#pragma once
// What a run holds of its GPU besides tensors: the device context it owns, and timelines of
// compute-stream events. Device-neutral declarations (no CUDA headers): the CUDA backend defines
// them (kernels/cuda/context.cpp, op_timer.cpp), and a build without it has versions that say
// so (kernels/cuda_absent.cpp).
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace mt::ops {

// GPUs visible to this process (CUDA_VISIBLE_DEVICES applies); 0 without the CUDA backend.
int gpu_count();

// The GPU a run computes on: the device, its compute stream (every op runs on it), the
// stream-ordered allocator behind Device::CUDA tensors and the cuBLASLt handle. Made once where
// the run picks its device, held by the run until every tensor and communicator on the device
// is gone, and found by the ops on CUDA tensors through gpu_context(); one at a time.
class GpuContext {
 public:
  // Sets up `device` (an index among the visible GPUs). Fails naming --device cuda when no GPU is
  // visible or the build has no CUDA backend.
  explicit GpuContext(int device = 0);
  // Waits for the compute stream, then releases it and the cuBLASLt handle; tensors freed later
  // return their memory in the default stream's order.
  ~GpuContext();
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  int device() const;
  // The compute stream (a cudaStream_t): communication on device buffers waits for it.
  void* compute_stream() const;
  std::string name() const;          // the device's name, e.g. "NVIDIA H100 80GB HBM3"
  size_t peak_memory_bytes() const;  // of Device::CUDA tensors since the start or the last reset
  // The same with kernel workspaces (GEMM, cuDNN attention, sorts) counted in: the real high water.
  size_t peak_memory_with_scratch_bytes() const;
  void reset_peak_memory();
  void synchronize() const;  // waits for the compute stream
  bool idle() const;         // whether everything queued on the compute stream has finished (no wait)

  struct Impl;  // the backend's state (kernels/cuda/context.h)
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The live GpuContext; fails when the run made none.
GpuContext& gpu_context();

// Timing spans of the compute stream (model::OpTimes on the GPU): a sequence of boundaries, each
// an event recorded on the live context's compute stream; the span between two consecutive
// boundaries belongs to one category (or to none). Recording never synchronises: elapsed times
// are read in resolve(), or opportunistically for spans whose events have already completed,
// and their events go back to a pool for reuse.
class EventTimeline {
 public:
  // `categories`: the number of span categories resolve() reports. Needs a live GpuContext;
  // fails in a build without the CUDA backend.
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A CUDA graph of what some code queues on the live context's compute stream, replayed with one
// launch (the inference engine's decode step: one launch instead of a few hundred). The captured
// code must not synchronise with the host or read device memory there; its allocations become the
// graph's own. Pointers are baked in: replays read the same buffers, whose contents may change.
class StreamGraph {
 public:
  StreamGraph();
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  // Captures f's work (nothing runs). Throws mt::Error where the capture fails (an operation
  // the capture refuses), leaving the stream usable and the graph empty.
  void capture(const std::function<void()>& f);
  void launch();  // queues one replay on the compute stream
  bool ready() const;
  // After capture: the captured graph's node census, one line ("181 nodes: 177 kernel, 1 memcpy,
  // ..., 12 of 200 edges programmatic"), to see what a replay really runs: memory alloc/free nodes
  // from allocations made during the capture, and whether dependent launches kept their
  // programmatic edges (issue #22's decode accounting).
  std::string census() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Device memory of its own for a graph's temporaries, so that the capture has no memory nodes
// (issue #22). Tensors allocated during a capture become the graph's memory alloc/free nodes: a
// decode step's ~200 small tensors put hundreds of them between its kernels, where they may cost
// scheduling time and stand between a GEMV and the kernel it is a programmatic dependent of.
// Captured inside serve(), every device tensor allocation is bump-allocated from the arena
// instead (no reuse: a replay's tensors never alias), and its frees are no-ops; the memory goes
// back when the arena is destroyed, which must outlive every replay of the graph (and every
// tensor that kept its memory). Size it with tally() over an eager run of the same work.
// The decode graphs use one by default (inference::ModelRunner; MT_DECODE_ARENA=0 turns it off):
// measured on an H200 in session 16, it removed the memory nodes and 0.03 ms of host gap per token.
class DeviceArena {
 public:
  // Runs f and returns the bytes its device tensor allocations take in an arena: every request,
  // rounded to 256 bytes, freed or not.
  static int64_t tally(const std::function<void()>& f);
  explicit DeviceArena(int64_t bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  // Runs f with the allocations served from the arena, from its start (a second serve reuses
  // the memory: only for work that replaces the first's). Requests that do not fit go to the
  // pool as before (misses()).
  void serve(const std::function<void()>& f);
  int64_t bytes() const { return bytes_; }
  int64_t used() const { return used_; }
  int64_t misses() const { return misses_; }

 private:
  char* base_ = nullptr;
  int64_t bytes_ = 0, used_ = 0, misses_ = 0;
};

// Generation's linear layers (issue #22): while an InferenceGemv lives on this thread, a GPU
// linear forward of at most 16 rows (a decode step's batch) runs the bandwidth-bound GEMV
// (kernels/cuda/gemv.cu) instead of cuBLASLt, whose plans for so few rows read the weights well
// below the memory bandwidth. Only the inference runner opens one: training's GEMMs, their
// results and their tests stay cuBLASLt's. Scopes nest; `on` false closes the GEMV for its span.
// `kernel`: how the GEMV spreads a weight row over its threads (gemv.cu says why): Wide (8 loads
// in flight per lane, long rows split over 4 warps) or Base (a warp per row, 4 loads: session
// 16's kernel); inference::ModelRunner takes it from MT_GEMV_KERNEL=wide|base, for A/B runs.
class InferenceGemv {
 public:
  enum class Kernel : unsigned char { Wide, Base };
  explicit InferenceGemv(bool on = true, Kernel kernel = Kernel::Wide) : prev_(active_), prev_kernel_(kernel_) {
    active_ = on;
    kernel_ = kernel;
  }
  ~InferenceGemv() {
    active_ = prev_;
    kernel_ = prev_kernel_;
  }
  InferenceGemv(const InferenceGemv&) = delete;
  InferenceGemv& operator=(const InferenceGemv&) = delete;
  static bool active() { return active_; }
  static Kernel kernel() { return kernel_; }

 private:
  bool prev_;
  Kernel prev_kernel_;
  static inline thread_local bool active_ = false;
  static inline thread_local Kernel kernel_ = Kernel::Wide;
};

// Generation's decode kernels (issue #22; on by default since session 16, `MT_DECODE_FUSED=0`
// turns them off, read by inference::ModelRunner at construction): while a DecodeKernels scope
// with `on` lives on this thread, the GPU ops that have a decode-specific kernel use it:
// argmax_rows splits each row of up to 64 over blocks whose last merges their bests (one block
// per row took 22 us on a 128k vocabulary), and cached_attention at a few query rows runs the
// kernel that keeps every key of a split in flight and shares each K/V load between the group's
// query heads. `fusions` (the runner's decode fusions, MT_DECODE_FUSIONS=0 off): that kernel
// merges its splits in its last block rather than in a kernel of its own. Off, the general
// kernels run (training never opens a scope). Scopes nest, as InferenceGemv's.
class DecodeKernels {
 public:
  explicit DecodeKernels(bool on = true, bool fusions = true) : prev_(active_), prev_fusions_(fusions_) {
    active_ = on;
    fusions_ = fusions;
  }
  ~DecodeKernels() {
    active_ = prev_;
    fusions_ = prev_fusions_;
  }
  DecodeKernels(const DecodeKernels&) = delete;
  DecodeKernels& operator=(const DecodeKernels&) = delete;
  static bool active() { return active_; }
  static bool fusions() { return active_ && fusions_; }

 private:
  bool prev_, prev_fusions_;
  static inline thread_local bool active_ = false;
  static inline thread_local bool fusions_ = true;
};

}  // namespace mt::ops
