#pragma once
// The steps of the GPU's vocab-parallel cross-entropy (ops::vocab_cross_entropy_forward runs
// them around its ShardReduce; tests run them rank by rank), for a rank that holds logit columns
// [start, start + vl). Tensors live on the GPU (labels I32, statistics f32, logits bf16, fp16 or
// f32); every call is asynchronous on the compute stream, deterministic, and never forms a
// probability tensor.
#include "core/tensor.h"

namespace mt::ops::gpu {

// Cross-entropy over this rank's logits [n, vl], in three steps around two all-reduces:
//  1) the per-row maximum, f32 [n]                                     -> all-reduce Max;
Tensor vocab_ce_row_max(const Tensor& logits);
//  2) per row, f32 [n, 2]: the sum of exp(x - max) over this rank's columns, and the target's
//     logit when labels[r] lies in [start, start + vl), else 0         -> all-reduce Sum;
Tensor vocab_ce_partial_stats(const Tensor& logits, const Tensor& labels, const Tensor& row_max, int64_t start);
//  3) lse = max + log(sum) and losses = lse - target logit, f32 [n] each.
void vocab_ce_finish(const Tensor& row_max, const Tensor& stats, Tensor& losses, Tensor& lse);

}  // namespace mt::ops::gpu
