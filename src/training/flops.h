#pragma once
#include "model/config.h"

namespace mt {
// Model FLOPs of one training iteration (forward + backward) for `batch` sequences of length
// `seq`, by DESIGN.md's formula (Megatron's, causal attention counted as half). MoE layers count
// the experts a token is routed to (top-k) and the shared expert: MFU over active parameters.
double flops_per_iteration(const model::TransformerConfig& c, int64_t batch, int64_t seq);
}  // namespace mt
