#pragma once
// Data parallelism over the model's flat fp32 grad buffer, as Megatron's DistributedDataParallel
// and DistributedOptimizer do it:
//  * The parameters are grouped into buckets walking them in backward order (the last layers
//    first), each bucket a contiguous range of the flat buffer; buckets are reduced over the DP
//    group in that order. With --overlap-grad-reduce a bucket's reduction starts, on the last
//    micro-batch, as soon as every parameter in it has its final gradient.
//  * Gradients are summed, not averaged: the trainer scales the loss by 1 / (tokens in the
//    global batch), so the sum is the global token-weighted mean gradient.
//  * With --use-distributed-optimizer each bucket is padded to a multiple of DP and every DP
//    rank owns one equal contiguous slice of it: gradients are reduce-scattered, the optimizer
//    (and its state) covers only the owned slices, and updated parameters are all-gathered
//    (--overlap-param-gather: the gather of a bucket is waited for when the next forward first
//    reads one of its parameters).
//  * --fp8-param-gather: the FP8 linears' weights get buckets of their own, gathered as FP8 codes
//    cast from the updated fp32 shards (parallel/fp8_param_gather.h).
//  * MoE experts (Param::expert) differ across expert-parallel ranks: they get buckets of their
//    own, after the dense ones in the buffer, reduced (and with the distributed optimizer
//    sharded) over the expert-data-parallel group instead of DP, as Megatron's expert buffers.
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "model/context.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/fp8_param_gather.h"
#include "parallel/process_groups.h"

namespace mt::parallel {

struct DDPOptions {
  bool overlap_grad_reduce = false;
  bool use_distributed_optimizer = false;
  bool overlap_param_gather = false;
  int64_t bucket_size = 0;  // elements; 0: Megatron's default (see effective_bucket_size)
};

// Megatron: one bucket for everything unless reductions overlap with backward, then
// max(40M, 1M x DP) elements (or --ddp-bucket-size).
int64_t effective_bucket_size(const DDPOptions& o, int dp_size);

struct Bucket {
  int64_t begin = 0, end = 0;  // flat range, padded (end - begin divisible by its group's size with the distributed optimizer)
  std::vector<const model::Param*> params;
  bool expert = false;                  // MoE experts' parameters, reduced over EDP
  bool fp8 = false;                     // FP8 linears' weights under --fp8-param-gather (gathered as FP8)
  comm::Communicator* group = nullptr;  // DP, or EDP for expert buckets
};

class DataParallel final : public model::ParamHooks {
 public:
  // `edp`: the expert-data-parallel group for MoE experts' gradients (null: DP).
  DataParallel(comm::CommPtr dp, const DDPOptions& opts, comm::CommPtr edp = nullptr);

  // The flat-buffer layout to build the model with (pass as ModelOptions::layout).
  model::LayoutFn layout_fn();
  // Call once the model's ParamStore is allocated with that layout.
  void attach(model::ParamStore& ps);
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Per iteration: reset, then mark the last micro-batch (only its backward launches buckets early).
  void start_iteration();
  void set_last_microbatch(bool last) { last_microbatch_ = last; }
  // Reduces every bucket not yet launched (in order), and waits for all.
  void finish_grad_sync();

  // This rank's optimizer slices: one [begin, end) per bucket (the whole buckets without the
  // distributed optimizer).
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;
  // The optimizer over owned_ranges() (with the distributed optimizer; otherwise the full buffer),
  // on the device of the attached parameters.
  std::unique_ptr<optim::Optimizer> make_optimizer(const optim::OptimizerConfig& cfg) const;
  // After the optimizer step: all-gather updated parameters (distributed optimizer only), and
  // under --fp8-param-gather cast the FP8 weights' shards and gather their codes.
  void start_param_gather();
  void finish_param_gather();

  // --fp8-param-gather. Whether some bucket holds FP8-gathered weights.
  bool fp8_param_gather() const { return has_fp8_; }
  // Before a pass: the FP8 codes of the weights as they are now, cast and gathered unless an
  // optimizer step's gather made them already (the first pass, and after invalidate).
  void prepare_fp8_params();
  // The weights changed outside the optimizer (a checkpoint load): cast them again before the next pass.
  void invalidate_fp8_params() { fp8_stale_ = true; }
  // The fp32 main values of the FP8 buckets gathered whole on every rank (a checkpoint save
  // reads them; the FP8 gather leaves other ranks' shards stale).
  void gather_main_values();

  void before_use(const model::Param& p) override;
  void grad_ready(const model::Param& p) override;
  bool needs_hooks() const { return opts_.overlap_grad_reduce || gathers_pending(); }
  // An all-gather of updated parameters is still writing into the model's buffers.
  bool param_gather_pending() const { return gathers_pending(); }
  // Some bucket is sharded: the optimizer steps on owned_ranges() only, and updated parameters
  // are gathered (start_param_gather).
  bool sharded() const;
  bool bucket_sharded(const Bucket& b) const { return opts_.use_distributed_optimizer && b.group->size() > 1; }
  // Whether any bucket holds expert parameters (MoE), and whether those are sharded.
  bool has_expert_buckets() const { return has_expert_; }
  bool experts_sharded() const { return has_expert_ && opts_.use_distributed_optimizer && edp_->size() > 1; }

 private:
  void plan_buckets(const std::deque<model::Param>& params, bool expert, bool fp8);
  void launch(size_t b);
  void start_fp8_gather(size_t b, bool roll);
  std::pair<int64_t, int64_t> owned_range(const Bucket& k) const;
  bool gathers_pending() const;
  void wait_gather(size_t b);

  comm::CommPtr dp_, edp_;
  DDPOptions opts_;
  bool has_expert_ = false;
  model::ParamStore* ps_ = nullptr;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_params_;  // planned, by registration index
  std::vector<bool> bucket_expert_;                 // planned: an expert bucket
  std::vector<bool> bucket_fp8_;                    // planned: an FP8-gathered bucket
  bool has_fp8_ = false, fp8_stale_ = true;
  std::vector<Fp8Bucket> fp8_;  // per bucket (used for FP8 buckets only)
  std::unordered_map<const model::Param*, size_t> bucket_of_;
  std::vector<int> ready_count_;
  std::vector<comm::WorkHandle> grad_work_, gather_work_;
  bool last_microbatch_ = true;
};

// The parameter spans that fall inside the flat range [lo, hi), with offsets relative to lo: an
// optimizer over one owned slice of the distributed optimizer.
std::vector<optim::ParamSpan> spans_within(const std::vector<optim::ParamSpan>& spans, int64_t lo, int64_t hi);

// Sum of squares of the gradients this rank is responsible for, reduced to the global value:
// tensor-parallel shards count on every TP rank, replicated parameters on TP rank 0 only, a
// tied embedding's pipeline replica not at all; with the distributed optimizer only the owned
// slices count, and the sum is reduced over DP too. `mp` spans TP x PP.
double global_grad_norm(model::ParamStore& ps, const std::vector<std::pair<int64_t, int64_t>>& owned, int tp_rank,
                        comm::Communicator& mp, comm::Communicator* dp_if_sharded);
// The same for a model that may hold MoE experts (`moe`: the model has MoE layers, on any
// stage): dense parameters as above; experts differ across EP ranks, so their squares (each
// expert's ETP shards, or ETP rank 0's copy) are summed over ETP x EP x PP, and over EDP with
// the distributed optimizer. Without `moe`, exactly the dense form.
double global_grad_norm(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe);
// --log-params-norm and --log-num-zeros-in-grad: the fp32 main parameters' global norm, and the
// global count of zero gradient elements, counted as the grad norm counts.
double global_params_norm(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe);
double global_grad_zeros(model::ParamStore& ps, const DataParallel& ddp, const ProcessGroups& pg, bool moe);

// Megatron's finalize step for sequence parallelism: the gradients of parameters marked
// `sequence_parallel` are partial per TP rank; sum them over TP (one coalesced all-reduce).
void all_reduce_sequence_parallel_grads(model::ParamStore& ps, comm::Communicator& tp);

// Megatron's finalize step for tied embeddings under pipeline parallelism: the first stage's
// embedding and the last stage's output weight are one parameter, so their gradients (after
// the DP reduction) are summed over the embedding group and both copies take the same step.
void all_reduce_embedding_grads(model::ParamStore& ps, comm::Communicator& embedding);

}  // namespace mt::parallel
