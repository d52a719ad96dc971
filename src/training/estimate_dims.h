#pragma once
// The sizes the memory model's formulas share (estimate_memory.cpp, estimate_fp8.cpp), for one
// micro-batch on one rank.
#include "training/arguments.h"

namespace mt::estimate {

struct Dims {
  double t = 0;    // tokens a rank's attention and MLP GEMMs see: micro-batch x seq / CP
  double tsp = 0;  // tokens of the residual stream on a rank: t / TP under sequence parallelism
  double e = 2;    // bytes of a stored activation (bf16/fp16 on the GPU; the CPU stores fp32)
  double h = 0, tp = 1, etp = 1, ep = 1;
  bool gpu = true;
};

inline Dims dims_of(const Arguments& a, bool gpu) {
  Dims d;
  d.gpu = gpu;
  d.tp = static_cast<double>(a.tensor_model_parallel_size);
  d.ep = static_cast<double>(a.expert_model_parallel_size);
  d.etp = static_cast<double>(a.expert_tensor_parallel_size > 0 ? a.expert_tensor_parallel_size
                                                                : a.tensor_model_parallel_size);
  d.t = static_cast<double>(a.micro_batch_size) * static_cast<double>(a.model.seq_length) /
        static_cast<double>(a.context_parallel_size);
  d.tsp = a.sequence_parallel ? d.t / d.tp : d.t;
  d.e = gpu ? 2.0 : 4.0;
  d.h = static_cast<double>(a.model.hidden_size);
  return d;
}

}  // namespace mt::estimate
