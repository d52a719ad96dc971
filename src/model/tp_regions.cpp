#include "model/tp_regions.h"

#include "core/error.h"
#include "model/context.h"

namespace mt::model {

TPRegion::Pair TPRegion::pair() const {
  using C = TPCollective;
  if (!tp_ || !tp_->on()) return {C::Identity, C::Identity};
  const bool sp = tp_->sp();
  switch (mapping_) {
    case TPMapping::ColumnInput:
      return sp ? Pair{C::AllGatherRows, C::ReduceScatterRows} : Pair{C::Identity, C::AllReduce};
    case TPMapping::RowOutput:
      return sp ? Pair{C::ReduceScatterRows, C::AllGatherRows} : Pair{C::AllReduce, C::Identity};
    case TPMapping::Features:
      return {C::AllGatherFeatures, C::ReduceScatterFeatures};
    case TPMapping::None:
      break;
  }
  return {C::Identity, C::Identity};
}

Tensor TPRegion::run(TPCollective c, const Tensor& x, OpTimes* times) const {
  if (c == TPCollective::Identity) return x;  // no scope: nothing to time
  ScopedOpTimer t(times, &OpTimes::communication);
  switch (c) {
    case TPCollective::AllReduce: {
      Tensor y = x;  // shares x's storage: the partial sums are not needed after
      all_reduce_tp(y, *tp_);
      return y;
    }
    case TPCollective::AllGatherRows:
      return all_gather_rows(x, *tp_);
    case TPCollective::ReduceScatterRows:
      return reduce_scatter_rows(x, *tp_);
    case TPCollective::AllGatherFeatures:
      return all_gather_last_dim(x, *tp_);
    case TPCollective::ReduceScatterFeatures:
      return reduce_scatter_last_dim(x, *tp_);
    case TPCollective::Identity:
      break;
  }
  return x;
}

TPRegion::InFlight TPRegion::start(TPCollective c, const Tensor& x, OpTimes* times) const {
  MT_CHECK(c == TPCollective::AllGatherRows || c == TPCollective::ReduceScatterRows,
           "only the sequence-parallel row collectives run asynchronously");
  InFlight f;
  f.input_ = x;
  if (c == TPCollective::AllGatherRows) f.result_ = gathered_rows_buffer(x, *tp_);
  ScopedOpTimer t(times, &OpTimes::communication);
  f.work_ = c == TPCollective::AllGatherRows ? all_gather_rows_async(x, f.result_, *tp_)
                                             : reduce_scatter_rows_async(x, f.result_, *tp_);
  return f;
}

Tensor TPRegion::InFlight::wait(OpTimes* times) {
  MT_CHECK(work_ != nullptr, "a tensor-parallel collective waited for twice, or never started");
  {
    ScopedOpTimer t(times, &OpTimes::communication);
    work_->wait();
  }
  work_.reset();
  input_ = Tensor();
  return std::move(result_);
}

}  // namespace mt::model
