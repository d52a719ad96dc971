#include "model/tensor_parallel.h"

#include "core/error.h"

namespace mt::model {

namespace {
void check_f32(const Tensor& t, const char* what) {
  MT_CHECK(t.dtype() == DType::F32, "{} of dtype {}: tensor-parallel communication is fp32", what,
           dtype_name(t.dtype()));
}
}  // namespace

Tensor all_gather_rows(const Tensor& shard, const TensorParallel& tp) {
  if (!tp.on()) return shard;
  check_f32(shard, "all_gather_rows");
  Shape s = shard.shape();
  s[0] *= tp.size();
  Tensor full = Tensor::empty(s, shard.dtype(), shard.device());
  tp.comm->all_gather(shard.raw(), full.raw(), static_cast<size_t>(shard.numel()), comm::DataType::F32);
  return full;
}

Tensor reduce_scatter_rows(const Tensor& full, const TensorParallel& tp) {
  if (!tp.on()) return full;
  check_f32(full, "reduce_scatter_rows");
  Shape s = full.shape();
  MT_CHECK(s[0] % tp.size() == 0, "{} rows do not split over {} TP ranks", s[0], tp.size());
  s[0] /= tp.size();
  Tensor shard = Tensor::empty(s, full.dtype(), full.device());
  tp.comm->reduce_scatter(full.raw(), shard.raw(), static_cast<size_t>(shard.numel()), comm::DataType::F32);
  return shard;
}

void all_reduce_tp(Tensor& x, const TensorParallel& tp) {
  if (!tp.on()) return;
  check_f32(x, "all_reduce_tp");
  tp.comm->all_reduce(x.raw(), static_cast<size_t>(x.numel()), comm::DataType::F32);
}

}  // namespace mt::model
