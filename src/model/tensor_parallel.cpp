#include "model/tensor_parallel.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace mt::model {

namespace {
// fp32 everywhere; bf16 for GPU activations, reduced in bf16 as Megatron does (CPU tensors are
// fp32 only: Gloo cannot reduce bf16). fp16 GPU activations: the communicators have no fp16
// type, so gathers move them as 2-byte bf16 elements (a gather copies bytes and never looks at
// them) and reductions go through fp32 (widened, reduced, rounded back to fp16 once).
comm::DataType comm_type(const Tensor& t, const char* what, bool reduces) {
  if (t.dtype() == DType::F32) return comm::DataType::F32;
  const bool gpu_half = t.device() != Device::CPU && (t.dtype() == DType::BF16 || t.dtype() == DType::F16);
  MT_CHECK(gpu_half && !(reduces && t.dtype() == DType::F16),
           "{} of dtype {} on {}: tensor-parallel communication is fp32, or bf16/fp16 on the GPU", what,
           dtype_name(t.dtype()), t.device() == Device::CPU ? "the CPU" : "the GPU");
  return comm::DataType::BF16;
}

bool is_f16(const Tensor& t) { return t.dtype() == DType::F16; }
Tensor widened(const Tensor& t) {
  Tensor w = Tensor::empty(t.shape(), DType::F32, t.device());
  ops::cast(t, w);
  return w;
}

// An fp16 reduction done in fp32: waits for it, then rounds the fp32 result into the fp16
// tensor (on the compute stream, after the collective).
class NarrowingWork final : public comm::Work {
 public:
  NarrowingWork(comm::WorkHandle inner, Tensor wide, Tensor out)
      : inner_(std::move(inner)), wide_(std::move(wide)), out_(std::move(out)) {}
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_ = nullptr;
    ops::cast(wide_, out_);
    wide_ = Tensor();
  }
  bool done() const override { return !inner_ || inner_->done(); }  // wait() still does the rounding

 private:
  comm::WorkHandle inner_;
  Tensor wide_, out_;
};
}  // namespace

Tensor gathered_rows_buffer(const Tensor& shard, const TensorParallel& tp) {
  Shape s = shard.shape();
  s[0] *= tp.size();
  return Tensor::empty(s, shard.dtype(), shard.device());
}

comm::WorkHandle all_gather_rows_async(const Tensor& shard, Tensor& full, const TensorParallel& tp) {
  const comm::DataType t = comm_type(shard, "all_gather_rows", false);
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
  if (is_f16(full)) {
    const Tensor wide_full = widened(full);
    Tensor wide_shard = Tensor::empty(s, DType::F32, full.device());
    comm::WorkHandle w = tp.comm->reduce_scatter_async(wide_full.raw(), wide_shard.raw(),
                                                       static_cast<size_t>(wide_shard.numel()), comm::DataType::F32,
                                                       comm::ReduceOp::Sum);
    return std::make_shared<NarrowingWork>(std::move(w), std::move(wide_shard), shard);
  }
  const comm::DataType t = comm_type(full, "reduce_scatter_rows", true);
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
  if (is_f16(x)) {
    Tensor w = widened(x);
    tp.comm->all_reduce(w.raw(), static_cast<size_t>(w.numel()), comm::DataType::F32);
    ops::cast(w, x);
    return;
  }
  const comm::DataType t = comm_type(x, "all_reduce_tp", true);
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
