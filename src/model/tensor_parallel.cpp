#include "model/tensor_parallel.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

namespace {
// fp32 everywhere; the GPU's bf16 or fp16 activations in their own type, reduced in it as
// Megatron does (CPU tensors are fp32 only: Gloo cannot reduce 16-bit floats).
comm::DataType comm_type(const Tensor& t, const char* what) {
  if (t.dtype() == DType::F32) return comm::DataType::F32;
  MT_CHECK(t.device() != Device::CPU && (t.dtype() == DType::BF16 || t.dtype() == DType::F16),
           "{} of dtype {} on {}: tensor-parallel communication is fp32, or bf16/fp16 on the GPU", what,
           dtype_name(t.dtype()), t.device() == Device::CPU ? "the CPU" : "the GPU");
  return t.dtype() == DType::F16 ? comm::DataType::F16 : comm::DataType::BF16;
}
}  // namespace

Tensor gathered_rows_buffer(const Tensor& shard, const TensorParallel& tp) {
  Shape s = shard.shape();
  s[0] *= tp.size();
  return Tensor::empty(s, shard.dtype(), shard.device());
}

comm::WorkHandle all_gather_rows_async(const Tensor& shard, Tensor& full, const TensorParallel& tp) {
  const comm::DataType t = comm_type(shard, "all_gather_rows");
  MT_CHECK(full.numel() == shard.numel() * tp.size(), "all_gather_rows: {} rows into {}", shard.shape_str(),
           full.shape_str());
  return tp.comm->all_gather_async(shard.raw(), full.raw(), static_cast<size_t>(shard.numel()), t);
}

Tensor all_gather_rows(const Tensor& shard, const TensorParallel& tp) {
  if (!tp.on()) return shard;
  Tensor full = gathered_rows_buffer(shard, tp);
  all_gather_rows_async(shard, full, tp)->wait();
  return full;
}

comm::WorkHandle reduce_scatter_rows_async(const Tensor& full, Tensor& shard, const TensorParallel& tp) {
  MT_CHECK(full.dim(0) % tp.size() == 0, "{} rows do not split over {} TP ranks", full.dim(0), tp.size());
  Shape s = full.shape();
  s[0] /= tp.size();
  shard = Tensor::empty(s, full.dtype(), full.device());
  const comm::DataType t = comm_type(full, "reduce_scatter_rows");
  return tp.comm->reduce_scatter_async(full.raw(), shard.raw(), static_cast<size_t>(shard.numel()), t,
                                       comm::ReduceOp::Sum);
}

Tensor reduce_scatter_rows(const Tensor& full, const TensorParallel& tp) {
  if (!tp.on()) return full;
  Tensor shard;
  reduce_scatter_rows_async(full, shard, tp)->wait();
  return shard;
}

void all_reduce_tp(Tensor& x, const TensorParallel& tp) {
  if (!tp.on()) return;
  const comm::DataType t = comm_type(x, "all_reduce_tp");
  tp.comm->all_reduce(x.raw(), static_cast<size_t>(x.numel()), t);
}

Tensor all_gather_last_dim(const Tensor& shard, const TensorParallel& tp) {
  if (!tp.on()) return shard;
  MT_CHECK(shard.ndim() == 2, "all_gather_last_dim of a {} tensor: [rows, features] expected", shard.shape_str());
  const int64_t rows = shard.dim(0), c = shard.dim(1), n = tp.size();
  Tensor stacked = all_gather_rows(shard, tp);  // [tp * rows, c], rank-major
  // [1, tp, rows, c] as heads -> rows [rows, tp * c]: element (s, h*c + d) = stacked[h, s, d].
  return ops::heads_to_rows(stacked.view({1, n, rows, c}), rows, 1, n, c);
}

Tensor reduce_scatter_last_dim(const Tensor& full, const TensorParallel& tp) {
  if (!tp.on()) return full;
  MT_CHECK(full.ndim() == 2, "reduce_scatter_last_dim of a {} tensor: [rows, features] expected", full.shape_str());
  const int64_t rows = full.dim(0), n = tp.size();
  MT_CHECK(full.dim(1) % n == 0, "{} features do not split over {} TP ranks", full.dim(1), n);
  const int64_t c = full.dim(1) / n;
  Tensor stacked = ops::rows_to_heads(full, rows, 1, n, c);  // [1, tp, rows, c]
  return reduce_scatter_rows(stacked.view({n * rows, c}), tp);
}

}  // namespace mt::model
