#pragma once
// Tensor-parallel regions, as Megatron-LM's tensor_parallel/mappings.py: where an activation
// enters or leaves the part of a layer that is split over the TP ranks, one mapping pairs the
// forward collective with the backward collective that is its transpose. Which collective each
// direction runs (identity, all-reduce, all-gather or reduce-scatter) is decided here, from the
// mapping and sequence parallelism, and nowhere else: layers name the mapping. Every collective
// is charged to OpTimes::communication here as well.
//
//   mapping       forward: no SP | SP                backward: no SP | SP
//   ColumnInput   identity | all-gather rows         all-reduce | reduce-scatter rows
//   RowOutput     all-reduce | reduce-scatter rows   identity | all-gather rows
//   Features      all-gather last dim                reduce-scatter last dim
//
// Megatron's names: ColumnInput is copy_to_tensor_model_parallel_region, or under SP
// gather_from_sequence_parallel_region; RowOutput is reduce_from_tensor_model_parallel_region,
// or reduce_scatter_to_sequence_parallel_region. Features is gather_from_tensor_model_parallel_
// region with a reduce-scatter for its backward: attention's KV replication gathers the QKV
// output's columns, and the ranks sharing a key/value group must sum their K/V gradients.
// Without tensor parallelism every mapping is the identity.
#include "comm/communicator.h"
#include "model/op_times.h"
#include "model/tensor_parallel.h"

namespace mt::model {

enum class TPMapping { None, ColumnInput, RowOutput, Features };

// What one direction of a mapping runs (tensor_parallel.h has the collectives themselves).
enum class TPCollective { Identity, AllReduce, AllGatherRows, ReduceScatterRows, AllGatherFeatures, ReduceScatterFeatures };

class TPRegion {
 public:
  // A collective started by start_forward / start_backward (the overlapped linears run a GEMM
  // while it is in flight). wait() finishes it, timed as communication, and returns its result
  // (on the GPU waiting orders the compute stream after the transfer; the host does not block).
  // It keeps the buffers the collective reads and writes alive until then.
  class InFlight {
   public:
    Tensor wait(OpTimes* times);

   private:
    friend class TPRegion;
    Tensor input_, result_;
    comm::WorkHandle work_;
  };

  TPRegion() = default;  // the identity both ways
  TPRegion(TPMapping mapping, const TensorParallel* tp) : mapping_(mapping), tp_(tp) {}

  TPCollective forward_collective() const { return pair().forward; }
  TPCollective backward_collective() const { return pair().backward; }
  // x's storage may be reused: an all-reduce sums in place, and the identity returns x itself.
  Tensor forward(const Tensor& x, OpTimes* times) const { return run(forward_collective(), x, times); }
  Tensor backward(const Tensor& dy, OpTimes* times) const { return run(backward_collective(), dy, times); }
  // Asynchronous forms, for the row collectives only (the mappings under sequence parallelism).
  InFlight start_forward(const Tensor& x, OpTimes* times) const { return start(forward_collective(), x, times); }
  InFlight start_backward(const Tensor& dy, OpTimes* times) const { return start(backward_collective(), dy, times); }

 private:
  struct Pair {
    TPCollective forward, backward;
  };
  Pair pair() const;  // the table above
  Tensor run(TPCollective c, const Tensor& x, OpTimes* times) const;
  InFlight start(TPCollective c, const Tensor& x, OpTimes* times) const;
  TPMapping mapping_ = TPMapping::None;
  const TensorParallel* tp_ = nullptr;
};

}  // namespace mt::model
