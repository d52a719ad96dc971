#pragma once
// Runs one global batch's micro-batches through this rank's model chunks in the order of its
// pipeline schedule (schedule.h), passing hidden states forward and their gradients backward
// between stages with asynchronous point-to-point messages on the pipeline group. With one
// pipeline rank it is plain gradient accumulation (F0 B0 F1 B1 ...).
//
// Message order: Gloo, like NCCL, matches the k-th send between two ranks with the k-th
// receive. Every rank can compute every rank's schedule, so it posts its receives from a
// neighbour in exactly the order that neighbour sends (with PP = 2 and virtual stages the
// activations and gradients between two ranks share one stream), keeping a message that
// arrives before it is needed. The receive for the next pass is posted before the current pass
// computes, so transfers overlap compute.
//
// Memory: saved activations are dropped as soon as their backward ran, so a stage holds at most
// PP - rank micro-batches (1F1B). A sent buffer must live until the transfer is done, but
// waiting for a send whose receiver has not posted its receive could deadlock; a send is
// therefore waited for (and its buffer freed) once a message arrives that the receiver sent
// after consuming it (the gradient of an activation, say), and what is left at the end of the
// batch, when every rank has posted every receive.
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "parallel/ddp.h"
#include "parallel/phase_timer.h"

namespace mt::parallel {

class PipelineRunner {
 public:
  // `pp`: the pipeline group (this rank's stage is its rank there). `group`: interleaved
  // schedules' micro-batches per chunk in turn (0: PP, Megatron's default).
  PipelineRunner(model::GPTModel& model, comm::CommPtr pp, int64_t group = 0);

  // Forward and backward of every micro-batch, the loss scaled by loss_grad_scale in backward.
  // `ddp` (may be null) gets the last-micro-batch marks and the parameter hooks. Returns this
  // rank's loss sums: zero unless it holds the loss (the last stage).
  model::LossSums train(const std::vector<model::Batch>& batches, float loss_grad_scale, const model::PassContext& ctx,
                        DataParallel* ddp);
  // Forwards only (evaluation); loss sums as for train.
  model::LossSums evaluate(const std::vector<model::Batch>& batches, const model::PassContext& ctx);

  // --timing-log-level 2: the per-micro-batch phases are timed through `t` (null: not timed).
  void set_phase_timer(PhaseTimer* t) { phase_timer_ = t; }

  // The most micro-batch passes whose activations this rank kept at once in the last call.
  int64_t max_in_flight() const { return max_in_flight_; }

 private:
  model::LossSums run(const std::vector<model::Batch>& batches, bool forward_only, float loss_grad_scale,
                      const model::PassContext& ctx, DataParallel* ddp);

  model::GPTModel& model_;
  comm::CommPtr pp_;
  int64_t group_;
  int64_t max_in_flight_ = 0;
  PhaseTimer* phase_timer_ = nullptr;
};

}  // namespace mt::parallel
