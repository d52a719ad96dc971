#include "model/tensor_parallel.h"

#include "core/error.h"

namespace mt::model {

namespace {
// fp32 everywhere; bf16 for GPU activations, reduced in bf16 as Megatron does (CPU tensors are
// fp32 only: Gloo cannot reduce bf16).
comm::DataType comm_type(const Tensor& t, const char* what) {
  if (t.dtype() == DType::F32) return comm::DataType::F32;
  MT_CHECK(t.dtype() == DType::BF16 && t.device() != Device::CPU,
           "{} of dtype {} on {}: tensor-parallel communication is fp32, or bf16 on the GPU", what,
           dtype_name(t.dtype()), t.device() == Device::CPU ? "the CPU" : "the GPU");
  return comm::DataType::BF16;
}
}  // namespace

Tensor all_gather_rows(const Tensor& shard, const TensorParallel& tp) {
  if (!tp.on()) return shard;
  const comm::DataType t = comm_type(shard, "all_gather_rows");
  Shape s = shard.shape();
  s[0] *= tp.size();
  Tensor full = Tensor::empty(s, shard.dtype(), shard.device());
  tp.comm->all_gather(shard.raw(), full.raw(), static_cast<size_t>(shard.numel()), t);
  return full;
}

Tensor reduce_scatter_rows(const Tensor& full, const TensorParallel& tp) {
  if (!tp.on()) return full;
  const comm::DataType t = comm_type(full, "reduce_scatter_rows");
  Shape s = full.shape();
  MT_CHECK(s[0] % tp.size() == 0, "{} rows do not split over {} TP ranks", s[0], tp.size());
  s[0] /= tp.size();
  Tensor shard = Tensor::empty(s, full.dtype(), full.device());
  tp.comm->reduce_scatter(full.raw(), shard.raw(), static_cast<size_t>(shard.numel()), t);
  return shard;
}

void all_reduce_tp(Tensor& x, const TensorParallel& tp) {
  if (!tp.on()) return;
  const comm::DataType t = comm_type(x, "all_reduce_tp");
  tp.comm->all_reduce(x.raw(), static_cast<size_t>(x.numel()), t);
}

}  // namespace mt::model
