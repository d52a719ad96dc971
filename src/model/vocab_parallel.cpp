#include "model/vocab_parallel.h"

#include "kernels/ops.h"

namespace mt::model {
namespace {

// This rank's first vocabulary id: rank r holds rows [r * vl, (r + 1) * vl).
int64_t first_id(const TensorParallel& tp, int64_t vl) { return tp.rank() * vl; }

// The statistics' all-reduce over the tensor-parallel group (none on one rank), on buffers of
// the op's device: host buffers through Gloo, device buffers through NCCL in stream order.
ops::ShardReduce tp_reduce(const TensorParallel& tp) {
  if (!tp.on()) return {};
  return [&tp](void* data, size_t count, ops::ReduceType type, ops::ReduceOp op) {
    tp.comm->all_reduce(data, count, type == ops::ReduceType::F64 ? comm::DataType::F64 : comm::DataType::F32,
                        op == ops::ReduceOp::Max ? comm::ReduceOp::Max : comm::ReduceOp::Sum);
  };
}

}  // namespace

Tensor vocab_parallel_embedding_forward(const Tensor& ids, const Tensor& table, const TensorParallel& tp) {
  return ops::vocab_embedding_forward(ids, table, first_id(tp, table.dim(0)));
}

void vocab_parallel_embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable, const TensorParallel& tp) {
  ops::vocab_embedding_backward(ids, dout, dtable, first_id(tp, dtable.dim(0)));
}

void vocab_parallel_cross_entropy_forward(const Tensor& logits, const Tensor& labels, const TensorParallel& tp,
                                          Tensor& losses, Tensor& lse) {
  ops::vocab_cross_entropy_forward(logits, labels, first_id(tp, logits.dim(1)), tp_reduce(tp), losses, lse);
}

Tensor vocab_parallel_cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                                             const Tensor& dloss, const TensorParallel& tp) {
  return ops::vocab_cross_entropy_backward(logits, labels, lse, dloss, first_id(tp, logits.dim(1)));
}

}  // namespace mt::model
