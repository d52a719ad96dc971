#pragma once
// Tensor parallelism as Megatron does it: the TP group, and the collectives that map between
// regions of activations [rows, h] whose rows are Megatron's [s, b] order flattened (seq-major),
// so a sequence shard under --sequence-parallel is a contiguous block of rows. Which collective
// runs where, forward and backward, is tp_regions.h's table; layers go through it.
// Tensors are fp32, or bf16 on the GPU (communicated in bf16, as Megatron does for activations).
#include "comm/communicator.h"
#include "core/tensor.h"
#include "model/params.h"

namespace mt::model {

struct TensorParallel {
  comm::Communicator* comm = nullptr;  // the TP group; null means no tensor parallelism
  bool sequence_parallel = false;
  // --tp-comm-overlap (with SP): the column-parallel linears overlap their sequence all-gather
  // with the GEMM on the rank's own rows, and in backward the input re-gather with the data
  // gradient GEMM and the gradient reduce-scatter with the weight gradient GEMM.
  bool overlap_comm = false;
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool on() const { return size() > 1; }
  bool sp() const { return on() && sequence_parallel; }
  // The split of a parameter sharded along `dim` (nothing when TP is off).
  TPSplit split(int dim, int blocks = 1) const { return on() ? TPSplit{dim, blocks, rank(), size()} : TPSplit{}; }
};

// [rows/tp, h] shard -> [rows, h], rank i's rows at block i.
Tensor all_gather_rows(const Tensor& shard, const TensorParallel& tp);
// [rows, h] partial sums -> this rank's [rows/tp, h] block of the sum.
Tensor reduce_scatter_rows(const Tensor& full, const TensorParallel& tp);
// Asynchronous forms: the buffers must stay alive until the handle is waited for (on the GPU,
// waiting orders the compute stream after the transfer; the host does not block).
// `full` must have tp.size() x the shard's rows (gathered_rows_buffer makes one).
Tensor gathered_rows_buffer(const Tensor& shard, const TensorParallel& tp);
comm::WorkHandle all_gather_rows_async(const Tensor& shard, Tensor& full, const TensorParallel& tp);
comm::WorkHandle reduce_scatter_rows_async(const Tensor& full, Tensor& shard, const TensorParallel& tp);
// In place sum over the TP group.
void all_reduce_tp(Tensor& x, const TensorParallel& tp);
// Along the last (feature) dimension, as Megatron's gather/scatter_along_last_dim: a
// [rows, n/tp] shard -> [rows, n] with rank i's columns at block i; and back, [rows, n] partial
// sums -> this rank's [rows, n/tp] column block of the sum. The row collectives plus a permute
// [tp, rows, n/tp] <-> [rows, n] (the heads <-> rows layout op, so it runs on CPU and GPU).
Tensor all_gather_last_dim(const Tensor& shard, const TensorParallel& tp);
Tensor reduce_scatter_last_dim(const Tensor& full, const TensorParallel& tp);

}  // namespace mt::model
