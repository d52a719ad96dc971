#pragma once
// Where a training step's time goes, by op category. Scopes (ScopedOpTimer) mark boundaries;
// the time between two boundaries is charged to the innermost open scope, so nested scopes are
// exclusive (a norm inside an attention scope counts as norm only) and nothing is counted
// twice. Time outside every scope is "other" in the breakdown.
//
// On the host (CPU ops) a boundary reads the steady clock. For GPU ops host time is
// meaningless (kernels are asynchronous), so after set_device(Device::CUDA) a boundary records
// a CUDA event on the compute stream instead (from a reusable pool, never synchronising), and
// the elapsed times are read only when resolve() is called, at log time or the end of the run.
// An event span measures the stream's time between the two points, which includes any time
// the GPU waited for the host to launch work: a launch-bound run shows up as slow ops.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "kernels/device.h"

namespace mt::model {

struct OpTimes {
  // Seconds per category. GEMM: linear layers; attention: the attention core (forward and
  // backward kernels); norms; elementwise: dropout, residual adds, activations, RoPE, layout
  // changes, embeddings; loss: cross-entropy; optimizer and communication: filled by the
  // trainer (and TP collectives inside the layers).
  double gemm = 0, attention = 0, norm = 0, elementwise = 0, loss = 0, optimizer = 0, communication = 0;
  // Mixture of experts: the router (scores, top-k, load-balancing terms), token permutation and
  // its inverse, and the experts' GEMMs (forward and backward each).
  double router = 0, permute = 0, expert_gemm = 0, unpermute = 0;
  // FP8: the casts of the GEMM operands (amax, scale update, quantization), named apart from the
  // GEMMs so that their cost shows.
  double fp8_cast = 0;

  OpTimes();
  ~OpTimes();
  OpTimes(const OpTimes&) = delete;
  OpTimes& operator=(const OpTimes&) = delete;

  // Which clock the scopes read: CPU (host steady clock, the default) or CUDA (events on the
  // compute stream; needs a CUDA build and a live ops::GpuContext). Not while a scope is open.
  void set_device(Device d);
  bool on_device() const { return dev_ != nullptr; }

  void begin(double OpTimes::*field);
  void end() noexcept;
  // Adds the pending GPU spans into the fields (waits for the last recorded event: call it only
  // when the totals are read). A no-op on the host clock.
  void resolve();
  // resolve(), then zero every field (per-interval breakdowns).
  void reset();
  // Sum of all categories (after resolve()).
  double sum() const;

 private:
  void mark() noexcept;
  std::vector<int8_t> open_;  // categories of the open scopes, innermost last
  std::chrono::steady_clock::time_point last_{};
  std::unique_ptr<ops::EventTimeline> dev_;  // the GPU clock, when set
};

// One line: each category's share of `total_seconds` (the time of the steps the totals cover)
// and "other" = total - sum of the categories, as percentages of the total, e.g.
// "time breakdown over 12.50 s: GEMM 41.2% | attention 12.0% | ... | other 9.8%".
// Resolves pending GPU spans first. total_seconds <= 0: percentages of the timed sum.
std::string format_op_breakdown(OpTimes& t, double total_seconds);
// The categories' seconds in the breakdown's order (resolves first), to gather them across
// ranks, and the same line from such a vector.
std::vector<double> category_seconds(OpTimes& t);
std::string format_op_breakdown(const std::vector<double>& seconds, double total_seconds);

}  // namespace mt::model
